package plugin

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
)

// DefaultStatusSocket is where `nri-gpu run` serves its status and
// `nri-gpu status` asks for it.
const DefaultStatusSocket = "/run/nri-gpu/status.sock"

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

// notReady says why the plugin is not ready, or "" when it is.
func (p *Plugin) notReady() string {
	switch {
	case p.state.Load() == nil:
		return "no inventory loaded"
	case !p.synced.Load():
		return "not connected to the runtime, or not yet synchronized with it"
	}
	return ""
}

// Status returns the plugin's readiness and allocation table.
func (p *Plugin) Status() Status {
	st := p.state.Load()
	s := Status{Reason: p.notReady(), GPUs: []GPUStatus{}}
	s.Ready = s.Reason == ""
	if st != nil {
		s.Sharing = st.sharing.String()
	}
	for _, row := range p.table.State() {
		g := GPUStatus{GPUState: row}
		if st != nil {
			if gs := byIndex(st.snap, []int{row.Index}); len(gs) == 1 {
				g.UUID = gs[0].ID()
			}
		}
		s.GPUs = append(s.GPUs, g)
	}
	return s
}

// StatusHandler serves the status API: GET /status returns Status as
// JSON; GET /ready answers 200 when the plugin is ready and 503 with the
// reason when it is not.
func (p *Plugin) StatusHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(p.Status())
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if r := p.notReady(); r != "" {
			http.Error(w, "not ready: "+r, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// ServeStatus serves StatusHandler on a unix socket at path (mode 0660,
// its directory created) until ctx is done. A stale socket left by a
// killed plugin is replaced; one that another process still serves is an
// error. It returns once the socket listens.
func (p *Plugin) ServeStatus(ctx context.Context, path string) error {
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
	srv := &http.Server{Handler: p.StatusHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.WithError(err).Error("status socket stopped")
		}
	}()
	p.log.Infof("serving status on %s", path)
	return nil
}
