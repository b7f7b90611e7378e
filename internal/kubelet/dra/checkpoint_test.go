package dra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// fullCheckpoint has every field of the current version set.
func fullCheckpoint() checkpoint {
	return checkpoint{Version: CheckpointVersion, Claims: map[string]checkpointClaim{
		"uid-1": {Namespace: "ml", Name: "train", Devices: []checkpointDevice{{Request: "gpu", Device: "gpu-0", UUID: "GPU-aaaaaaaa", MIG: true,
			Node: "/dev/nvidia0", Nodes: []string{"/dev/nvidia0"}, AdminAccess: true, CDIDevice: "k8s.gpu.nri-gpu.dev/claim=uid-1-gpu-0",
			ShareID: "s", ShareMiB: 1, GPUMemoryMiB: 2, Sharing: "MPS",
			MPS: &checkpointMPS{PipeDir: "/p", LogDir: "/l", ShmDir: "/s", MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 3, PinnedMemoryMiB: 4}}}}},
	}}
}

// TestCheckpointFormat holds the form this nri-gpu writes: a field added,
// removed or renamed fails here, and takes a new checkpoint version (an
// older nri-gpu must refuse the file, not misread it), a conversion from
// this one, and a new golden line.
func TestCheckpointFormat(t *testing.T) {
	data, err := json.Marshal(fullCheckpoint())
	if err != nil {
		t.Fatal(err)
	}
	const golden = `{"version":"dra.nri-gpu.dev/v2","claims":{"uid-1":{"namespace":"ml","name":"train","devices":[{"request":"gpu","device":"gpu-0","uuid":"GPU-aaaaaaaa","mig":true,` +
		`"node":"/dev/nvidia0","nodes":["/dev/nvidia0"],"adminAccess":true,"cdiDevice":"k8s.gpu.nri-gpu.dev/claim=uid-1-gpu-0","shareID":"s","shareMiB":1,"gpuMemoryMiB":2,` +
		`"sharing":"MPS","mps":{"pipeDir":"/p","logDir":"/l","shmDir":"/s","activeThreadPercentage":3,"pinnedMemoryMiB":4}}]}}}`
	if string(data) != golden {
		t.Errorf("the checkpoint's form changed: bump CheckpointVersion, convert %s on read, and update this line:\n%s\nwas\n%s", CheckpointVersion, data, golden)
	}
	back, err := decodeCheckpoint(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(fullCheckpoint(), back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

// TestCheckpointV1 reads the files nri-gpu wrote as v1: without the
// fields added within v1 (no sharing), and with them; both become the
// current version, with the same claims.
func TestCheckpointV1(t *testing.T) {
	plain := `{"version":"dra.nri-gpu.dev/v1","claims":{"uid-1":{"namespace":"ml","name":"train","devices":[{"request":"gpu","device":"gpu-0","uuid":"GPU-aaaaaaaa",` +
		`"node":"/dev/nvidia0","nodes":["/dev/nvidia0"],"cdiDevice":"k8s.gpu.nri-gpu.dev/claim=uid-1-gpu-0"}]}}}`
	c, err := decodeCheckpoint([]byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	want := checkpoint{Version: CheckpointVersion, Claims: map[string]checkpointClaim{"uid-1": {Namespace: "ml", Name: "train", Devices: []checkpointDevice{
		{Request: "gpu", Device: "gpu-0", UUID: "GPU-aaaaaaaa", Node: "/dev/nvidia0", Nodes: []string{"/dev/nvidia0"}, CDIDevice: "k8s.gpu.nri-gpu.dev/claim=uid-1-gpu-0"}}}}}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("v1 without sharing (-want +got):\n%s", diff)
	}
	// The fields added within v1, as the last v1 writer wrote them
	// (pinnedMemoryMiB left out when 0).
	shared := strings.Replace(plain, `"cdiDevice":"k8s.gpu.nri-gpu.dev/claim=uid-1-gpu-0"`, `"cdiDevice":"k8s.gpu.nri-gpu.dev/claim=uid-1-gpu-0","shareID":"s","shareMiB":1,"gpuMemoryMiB":2,`+
		`"sharing":"MPS","mps":{"pipeDir":"/p","logDir":"/l","shmDir":"/s","activeThreadPercentage":3}`, 1)
	c, err = decodeCheckpoint([]byte(shared))
	if err != nil {
		t.Fatal(err)
	}
	d := &want.Claims["uid-1"].Devices[0]
	d.ShareID, d.ShareMiB, d.GPUMemoryMiB, d.Sharing = "s", 1, 2, "MPS"
	d.MPS = &checkpointMPS{PipeDir: "/p", LogDir: "/l", ShmDir: "/s", MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 3}}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("v1 with sharing (-want +got):\n%s", diff)
	}
}

// TestCheckpointUnreadable: a checkpoint that exists and cannot be read
// is a *CheckpointError naming the file and what is wrong: truncated, not
// JSON, empty, a newer version, an unknown or repeated field, a device
// without its identity.
func TestCheckpointUnreadable(t *testing.T) {
	full, _ := json.Marshal(fullCheckpoint())
	for _, tc := range []struct{ name, data, want string }{
		{"truncated", string(full[:len(full)/2]), "unexpected end of JSON input"},
		{"empty", "", "unexpected end of JSON input"},
		{"not JSON", "\x00\x01", "invalid character"},
		{"newer", `{"version":"dra.nri-gpu.dev/v3","claims":{}}`, `version "dra.nri-gpu.dev/v3" is not one this nri-gpu reads`},
		{"no version", `{"claims":{}}`, `version "" is not one`},
		{"unknown field", `{"version":"dra.nri-gpu.dev/v2","claims":{},"leases":{}}`, `unknown field "leases"`},
		{"unknown field in v1", `{"version":"dra.nri-gpu.dev/v1","claims":{"u":{"devices":[{"device":"gpu-0","uuid":"GPU-a","node":"/dev/nvidia0","nodes":["/dev/nvidia0"],"minor":0}]}}}`, `unknown field "claims.u.devices[0].minor"`},
		{"repeated field", `{"version":"dra.nri-gpu.dev/v2","claims":{},"claims":{}}`, `duplicate field "claims"`},
		{"no UUID", `{"version":"dra.nri-gpu.dev/v2","claims":{"u":{"namespace":"ml","name":"x","devices":[{"device":"gpu-0","node":"/dev/nvidia0","nodes":["/dev/nvidia0"]}]}}}`,
			`claim "u" (ml/x) device 0 lacks its UID, name, UUID or device nodes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, CheckpointFile), []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := ReadPrepared(dir)
			var ce *CheckpointError
			if !errors.As(err, &ce) || ce.Path != filepath.Join(dir, CheckpointFile) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ReadPrepared: %v\nwant a *CheckpointError naming %q", err, tc.want)
			}
		})
	}
}

// previousDecoder is readCheckpoint's decoding as the nri-gpu before
// CheckpointV2 had it, copied whole: what a rollback to that binary reads
// a checkpoint with.
func previousDecoder(data []byte) error {
	var head struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return err
	}
	if head.Version != CheckpointV1 {
		return fmt.Errorf("version %q is not one this nri-gpu reads (%s); a newer nri-gpu wrote it", head.Version, CheckpointV1)
	}
	var c checkpointV1
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(&c)
}

// TestCheckpointRollback: a checkpoint this nri-gpu writes, read by the
// previous nri-gpu's decoder, is refused (fails closed), not read as no
// claims. (What that binary does with the refusal is in dra.md: it only
// warns.) And the previous binary's own files this one reads.
func TestCheckpointRollback(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	c := e.claim(t, "train", "uid-1", false, "gpu-0")
	if r := e.prepare(t, c); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	data, err := os.ReadFile(filepath.Join(e.dirs.PluginDir, CheckpointFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := previousDecoder(data); err == nil || !strings.Contains(err.Error(), `version "dra.nri-gpu.dev/v2" is not one this nri-gpu reads`) {
		t.Errorf("the previous decoder read this checkpoint: %v", err)
	}
	v1 := strings.Replace(string(data), CheckpointV2, CheckpointV1, 1)
	if err := previousDecoder([]byte(v1)); err != nil {
		t.Fatalf("the previous decoder's own form: %v", err)
	}
	if got, err := decodeCheckpoint([]byte(v1)); err != nil || len(got.Claims) != 1 {
		t.Errorf("a v1 file: %v, %d claims", err, len(got.Claims))
	}
}

// FuzzDecodeCheckpoint: any file is read without panicking; what is
// accepted names every device's identity, and reads back the same once
// written in the current version.
func FuzzDecodeCheckpoint(f *testing.F) {
	full, _ := json.Marshal(fullCheckpoint())
	f.Add(string(full))
	f.Add(strings.Replace(string(full), CheckpointV2, CheckpointV1, 1))
	f.Add(`{"version":"dra.nri-gpu.dev/v1","claims":{}}`)
	f.Add(string(full[:len(full)/2]))
	f.Fuzz(func(t *testing.T, data string) {
		c, err := decodeCheckpoint([]byte(data))
		if err != nil {
			return
		}
		if c.Version != CheckpointVersion || c.check() != nil {
			t.Fatalf("accepted %q as %+v", data, c)
		}
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeCheckpoint(again)
		if err != nil {
			t.Fatalf("written back %s: %v", again, err)
		}
		if diff := cmp.Diff(c, back, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip (-read +written back):\n%s", diff)
		}
	})
}
