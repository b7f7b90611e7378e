package status

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// TestSocketMode checks that the status socket never exists with a mode
// wider than SocketMode, even under a umask of 0, where a socket bound at
// its path is created 0777 (anyone may connect) until a chmod narrows it.
// A goroutine looks at the path in a tight loop while the socket is
// created 200 times; each time Serve returns, the socket has its mode, its
// directory has no other entry (the private directory it was bound in is
// gone), and it answers.
//
// The window of a chmod after the bind is a few microseconds, yet the
// watcher saw the socket at 0777 in each of 10 runs (go test -race) of the
// code that had it; the test then fails. With the socket bound
// elsewhere and renamed into place there is no window, so the test cannot
// fail by chance.
func TestSocketMode(t *testing.T) {
	old := syscall.Umask(0) // process-wide: no other test of this package runs in parallel
	defer syscall.Umask(old)
	dir, err := os.MkdirTemp("", "nri-st-") // short: socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "run", "status.sock")
	log := logrus.New()
	log.SetOutput(io.Discard)

	var wider atomic.Uint32 // the widest mode seen beyond SocketMode, plus 1<<31 when seen
	var seen atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var st syscall.Stat_t
			if syscall.Lstat(path, &st) == nil {
				seen.Add(1)
				if perm := st.Mode & 0o7777; perm&^SocketMode != 0 {
					wider.Store(1<<31 | perm)
				}
			}
		}
	}()

	c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		if err := Serve(ctx, path, &fixed{Ready: true}, log); err != nil {
			cancel()
			t.Fatal(err)
		}
		if i == 0 {
			fi, err := os.Lstat(path)
			if err != nil || fi.Mode() != os.ModeSocket|SocketMode {
				t.Fatalf("socket %s: %v, %v; want %v", path, fi.Mode(), err, os.ModeSocket|SocketMode)
			}
			entries, _ := os.ReadDir(filepath.Dir(path))
			if len(entries) != 1 {
				t.Errorf("the socket's directory holds %d entries, want only the socket: %v", len(entries), entries)
			}
			if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("the socket's directory: %v, %v; want 0755", fi.Mode(), err)
			}
			resp, err := c.Get("http://nri-gpu/ready")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /ready: %v, %v", resp, err)
			}
			resp.Body.Close()
			c.CloseIdleConnections()
		}
		cancel()
		// Serve's goroutine closes the listener and removes the socket.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if _, err := os.Lstat(path); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the socket %s is still there 10 s after its context was cancelled", path)
			}
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("the watcher saw the socket %d times", seen.Load())
	if w := wider.Load(); w != 0 {
		t.Errorf("the socket existed with mode %#o, wider than %#o", w&^(1<<31), SocketMode)
	}
}
