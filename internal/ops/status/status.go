// Package status is nri-gpu's report about itself on a unix socket:
// readiness and the allocation table, as JSON (GET /status) and as a
// readiness check (GET /ready), for `nri-gpu status`, probes and
// `nri-gpu doctor`. It knows nothing of NRI: a Reporter says what to
// report.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
)

// DefaultSocket is where `nri-gpu run` serves its status and
// `nri-gpu status` asks for it.
const DefaultSocket = "/run/nri-gpu/status.sock"

// Reporter is what the status API reports on: the plugin.
type Reporter interface {
	// Status returns the current status.
	Status() Status
}

// Status is what the plugin reports about itself: readiness and the
// allocation table.
type Status struct {
	Ready bool `json:"ready"`
	// Reason says why the plugin is not ready; empty when it is.
	Reason string `json:"reason,omitempty"`
	// Sharing is the node's sharing policy.
	Sharing string      `json:"sharing"`
	GPUs    []GPUStatus `json:"gpus"`
}

// GPUStatus is one GPU of the allocation table.
type GPUStatus struct {
	alloc.GPUState
	UUID string `json:"uuid,omitempty"`
	// Name is the unit as users name it: the GPU's index, or a MIG
	// device's <gpu>:<mig> (whose index is its key, inventory.MIGKey).
	Name string `json:"name,omitempty"`
	// Kubelet are the containers the kubelet assigned the GPU (through
	// nri-gpu's device plugin, checked against their device nodes):
	// the holders marked kubelet; empty when none. Holders lists
	// every holder, the kubelet's and those of requests nri-gpu read.
	Kubelet []alloc.Holder `json:"kubelet"`
}

// KubeletHolders returns the holders of row that the kubelet assigned the
// GPU (alloc.HolderState.Kubelet), never nil.
func KubeletHolders(row alloc.GPUState) []alloc.Holder {
	out := []alloc.Holder{}
	for _, h := range row.Holders {
		if h.Kubelet {
			out = append(out, h.Holder)
		}
	}
	return out
}

// Handler serves the status API: GET /status returns r's Status as JSON;
// GET /ready answers 200 when the plugin is ready and 503 with the reason
// when it is not.
func Handler(r Reporter) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r.Status())
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if s := r.Status(); !s.Ready {
			http.Error(w, "not ready: "+s.Reason, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// SocketMode is the status socket's mode: the owner and its group may
// connect (connecting needs write permission), no one else: the status
// names pods.
const SocketMode = 0o660

// Serve serves Handler(r) on a unix socket at path (mode SocketMode, its
// directory created) until ctx is done. A stale socket left by a killed
// plugin is replaced; one that another process still serves is an error.
// It returns once the socket listens; log hears of a server that stops.
//
// The socket never exists at path with another mode: it is bound in a
// private directory (mode 0700) beside path, given its mode there and
// renamed into place, since bind creates it with the process's umask
// and a chmod after the bind leaves a window in which anyone could
// connect.
func Serve(ctx context.Context, path string, r Reporter, log logrus.FieldLogger) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("status socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("status socket %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return fmt.Errorf("status socket %s: another process serves it", path)
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("status socket: %w", err)
		}
	}
	l, err := listen(path)
	if err != nil {
		return fmt.Errorf("status socket: %w", err)
	}
	srv := &http.Server{Handler: Handler(r), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
		// The listener was bound elsewhere: remove the socket here,
		// unless another process has replaced it since.
		if fi, err := os.Lstat(path); err == nil && os.SameFile(fi, l.fi) {
			os.Remove(path)
		}
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.WithError(err).Error("status socket stopped")
		}
	}()
	log.Infof("serving status on %s", path)
	return nil
}

// listener is a unix listener bound elsewhere and renamed to its path.
type listener struct {
	*net.UnixListener
	fi os.FileInfo
}

// listen binds a unix socket at path with SocketMode and no window with
// another mode: bound in a new directory of mode 0700 in path's directory
// (only this process's user can reach it there), chmod there, then
// renamed to path, which replaces a stale socket atomically.
func listen(path string) (*listener, error) {
	private, err := os.MkdirTemp(filepath.Dir(path), ".s") // 0700; short: socket paths are limited to 107 bytes
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	fail := func(err error) (*listener, error) {
		l.Close()
		return nil, err
	}
	if err := os.Chmod(tmp, SocketMode); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return &listener{UnixListener: l, fi: fi}, nil
}

// Holdings returns the allocation table s reports as holdings, one per
// holder with the GPUs it holds: what nri-gpu explain starts its own
// table from.
func (s Status) Holdings() ([]alloc.Holding, error) {
	byID := map[string]*alloc.Holding{}
	var order []string
	for _, g := range s.GPUs {
		for _, h := range g.Holders {
			mode, err := sharing.ParseMode(h.Mode)
			if err != nil {
				return nil, fmt.Errorf("GPU %s, holder %s: %w", g.Name, h.Holder, err)
			}
			held := byID[h.ID]
			if held == nil {
				held = &alloc.Holding{Holder: h.Holder, Mode: mode, Kubelet: h.Kubelet, Runtime: h.Runtime}
				byID[h.ID] = held
				order = append(order, h.ID)
			}
			held.GPUs = append(held.GPUs, g.Index)
		}
	}
	out := make([]alloc.Holding, len(order))
	for i, id := range order {
		out[i] = *byID[id]
	}
	return out, nil
}
