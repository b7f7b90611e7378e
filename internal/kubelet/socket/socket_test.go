package socket

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOverlap: a second instance replaces the first's socket; the first
// closing later leaves the second's file and service in place; the
// second closing removes its own.
func TestOverlap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plugin.sock")
	ctx := context.Background()
	older, err := Listen(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	newer, err := Listen(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := newer.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("newer"))
			_ = c.Close()
		}
	}()
	if err := older.Close(); err != nil {
		t.Fatalf("closing the older listener: %v", err)
	}
	if !Owns(path, newer.(*listener).made) {
		t.Fatalf("closing the older listener removed or replaced the newer one's socket %s", path)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the newer listener no longer answers at %s: %v", path, err)
	}
	buf := make([]byte, 5)
	if _, err := c.Read(buf); err != nil || string(buf) != "newer" {
		t.Errorf("read %q, %v from %s; want the newer listener's answer", buf, err, path)
	}
	_ = c.Close()
	if err := newer.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("after the newer listener closed, %s: %v; want it removed", path, err)
	}
}

// TestStale: a file left at the path (a crashed instance's socket) is
// replaced; a directory there is an error naming the path.
func TestStale(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "plugin.sock")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(context.Background(), path)
	if err != nil {
		t.Fatalf("over a stale file: %v", err)
	}
	_ = l.Close()
	busy := filepath.Join(dir, "busy")
	if err := os.MkdirAll(filepath.Join(busy, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(context.Background(), busy); err == nil || !strings.Contains(err.Error(), busy) {
		t.Errorf("over a directory: %v; want an error naming %s", err, busy)
	}
}
