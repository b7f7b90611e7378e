// Package mps runs the MPS control daemons of the GPUs that
// devicePlugin.sharing.mps shares (Supervisor, run by `nri-gpu mps`), and
// tells the node's state whether each is ready (Probe, read by `nri-gpu
// run`). The two meet in the GPU's daemon directory,
// <mpsRoot>/<GPU UUID>/: the daemon's pipe and log directories, and the
// ready file that the supervisor writes once the daemon runs with its
// limits, and touches every HeartbeatInterval while it does.
package mps

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// ReadyFile is the ready file's name in a GPU's daemon directory.
const ReadyFile = "ready"

// ReadyVersion is the version of the ready file's format.
const ReadyVersion = 1

// HeartbeatInterval is how often the supervisor checks a ready daemon and
// touches its ready file; a file untouched for StaleAfter says nothing
// (the supervisor is gone), and the daemon counts as not ready.
const (
	HeartbeatInterval = time.Second
	StaleAfter        = 5 * time.Second
)

// maxReadyFile bounds what Probe reads of a ready file.
const maxReadyFile = 4096

// Ready is the ready file: what the supervisor set the daemon up with. It
// survives a restart of either side, so it carries a version.
type Ready struct {
	Version int    `json:"version"`
	UUID    string `json:"uuid"`
	// MPSLimits are the limits the daemon holds each client to.
	sharing.MPSLimits
	// PID is the daemon's process id, in the supervisor's PID namespace.
	PID int `json:"pid"`
	// Started is when the supervisor started or adopted it.
	Started time.Time `json:"started"`
}

// DaemonDir returns the directory of d's daemon: the parent of its pipe
// directory, <mpsRoot>/<GPU UUID>.
func DaemonDir(d *sharing.MPSDaemon) string { return filepath.Dir(d.PipeDir) }

// Probe says of each daemon (by GPU UUID) whether the supervisor reports
// it ready with the limits the plan asks for, at time now: a ready file of
// this version, for this GPU, with these limits, touched within
// StaleAfter. It reads one small file per daemon.
func Probe(daemons map[string]*sharing.MPSDaemon, now time.Time) map[string]sharing.MPSStatus {
	out := make(map[string]sharing.MPSStatus, len(daemons))
	for uuid, d := range daemons {
		out[uuid] = probe(uuid, d, now)
	}
	return out
}

func probe(uuid string, d *sharing.MPSDaemon, now time.Time) sharing.MPSStatus {
	r, mtime, err := readReady(DaemonDir(d))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return sharing.MPSStatus{Why: fmt.Sprintf("nri-gpu mps reports no running MPS control daemon for GPU %s (no %s in %s)", uuid, ReadyFile, DaemonDir(d))}
	case err != nil:
		return sharing.MPSStatus{Why: fmt.Sprintf("the MPS control daemon of GPU %s: %v", uuid, err)}
	case r.UUID != uuid:
		return sharing.MPSStatus{Why: fmt.Sprintf("%s names GPU %q, not %s", filepath.Join(DaemonDir(d), ReadyFile), r.UUID, uuid)}
	case r.MPSLimits != d.MPSLimits:
		return sharing.MPSStatus{Why: fmt.Sprintf("the MPS control daemon of GPU %s holds clients to %s, the configuration asks for %s: restart nri-gpu mps to apply it",
			uuid, r.MPSLimits, d.MPSLimits)}
	}
	if age := now.Sub(mtime); age > StaleAfter || age < -StaleAfter {
		return sharing.MPSStatus{Why: fmt.Sprintf("nri-gpu mps has not reported the MPS control daemon of GPU %s ready for more than %s (is nri-gpu mps running?)", uuid, StaleAfter)}
	}
	return sharing.MPSStatus{Ready: true}
}

// readReady reads the ready file in dir and its modification time.
func readReady(dir string) (Ready, time.Time, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Ready{}, time.Time{}, err
	}
	defer root.Close()
	f, err := root.Open(ReadyFile)
	if err != nil {
		return Ready{}, time.Time{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Ready{}, time.Time{}, err
	}
	if !fi.Mode().IsRegular() {
		return Ready{}, time.Time{}, fmt.Errorf("%s is not a regular file", ReadyFile)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxReadyFile+1))
	if err != nil {
		return Ready{}, time.Time{}, err
	}
	if len(data) > maxReadyFile {
		return Ready{}, time.Time{}, fmt.Errorf("%s is larger than %d bytes", ReadyFile, maxReadyFile)
	}
	var r Ready
	if err := json.Unmarshal(data, &r); err != nil {
		return Ready{}, time.Time{}, fmt.Errorf("reading %s: %w", ReadyFile, err)
	}
	if r.Version != ReadyVersion {
		return Ready{}, time.Time{}, fmt.Errorf("%s has version %d; this nri-gpu reads version %d", ReadyFile, r.Version, ReadyVersion)
	}
	return r, fi.ModTime(), nil
}

// writeReady writes r as dir's ready file, atomically.
func writeReady(dir string, r Ready) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+ReadyFile+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ReadyFile)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", filepath.Join(dir, ReadyFile), err)
	}
	return nil
}

// removeReady removes dir's ready file: the daemon is not ready.
func removeReady(dir string) error {
	if err := os.Remove(filepath.Join(dir, ReadyFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", filepath.Join(dir, ReadyFile), err)
	}
	return nil
}
