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

	"github.com/nri-gpu/nri-gpu/alloc"
	"github.com/sirupsen/logrus"
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

// Serve serves Handler(r) on a unix socket at path (mode 0660, its
// directory created) until ctx is done. A stale socket left by a killed
// plugin is replaced; one that another process still serves is an error.
// It returns once the socket listens; log hears of a server that stops.
func Serve(ctx context.Context, path string, r Reporter, log logrus.FieldLogger) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
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
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("status socket: %w", err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return fmt.Errorf("status socket: %w", err)
	}
	srv := &http.Server{Handler: Handler(r), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.WithError(err).Error("status socket stopped")
		}
	}()
	log.Infof("serving status on %s", path)
	return nil
}
