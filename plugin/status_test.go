package plugin

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
)

func get(t *testing.T, socket, path string) (int, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	resp, err := c.Get("http://x" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestStatusSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "nri-st-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "sub", "status.sock")
	p := testPlugin(sharing.Exclusive, io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// A stale socket (nobody listening) is replaced.
	os.MkdirAll(filepath.Dir(socket), 0o755)
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if err := status.Serve(ctx, socket, p, p.log); err != nil {
		t.Fatalf("ServeStatus over a stale socket: %v", err)
	}
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode: %v, %v", fi.Mode(), err)
	}
	// A live one is not taken over.
	if err := status.Serve(ctx, socket, testPlugin(sharing.Shared, io.Discard), p.log); err == nil || !strings.Contains(err.Error(), "another process serves it") {
		t.Errorf("second ServeStatus: %v", err)
	}

	if code, body := get(t, socket, "/ready"); code != 503 || body != "not ready: not connected to the runtime, or not yet synchronized with it\n" {
		t.Errorf("/ready before sync: %d %q", code, body)
	}
	pod, ctr := podCtr("train", "2")
	if _, _, err := p.CreateContainer(ctx, pod, ctr); err != nil {
		t.Fatal(err)
	}
	p.Synchronize(ctx, nil, nil)
	if code, body := get(t, socket, "/ready"); code != 200 || body != "ready\n" {
		t.Errorf("/ready after sync: %d %q", code, body)
	}
	if _, _, err := p.CreateContainer(ctx, pod, ctr); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, socket, "/status")
	var s status.Status
	if err := json.Unmarshal([]byte(body), &s); code != 200 || err != nil {
		t.Fatalf("/status: %d %v %s", code, err, body)
	}
	if !s.Ready || s.Sharing != "exclusive" || len(s.GPUs) != 8 || s.GPUs[1].UUID != uuid(1) || s.GPUs[1].Mode != "exclusive" ||
		len(s.GPUs[1].Holders) != 1 || s.GPUs[1].Holders[0].Pod != "train" || s.GPUs[1].Holders[0].ID != "ctr-train" || s.GPUs[2].Mode != "free" {
		t.Errorf("/status = %+v", s)
	}
	if code, _ := get(t, socket, "/nothing"); code != 404 {
		t.Errorf("unknown path: %d", code)
	}

	cancel()
	p2 := &Plugin{log: logrus.New(), table: alloc.New(nil)}
	if r := p2.notReady(); r != "no inventory loaded" {
		t.Errorf("plugin without inventory: %q", r)
	}
}
