package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// countingListener counts the connections the process holds: accepted
// from the kernel and not yet closed.
type countingListener struct {
	net.Listener
	held, max atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	n := l.held.Add(1)
	for m := l.max.Load(); n > m && !l.max.CompareAndSwap(m, n); m = l.max.Load() {
	}
	return &countedConn{Conn: c, l: l}, nil
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.held.Add(-1) })
	return c.Conn.Close()
}

// TestIdleConnections opens many connections to a real listener, half of
// them keep-alive connections left idle after one request, half silent
// from the start, and checks that the server closes every one of them
// (after its timeout, or to make room for a newer one) and never holds
// more than MaxConns at once (plus the one just accepted).
//
// The timeouts are short (200 ms idle) so that the test is quick; the only
// time bound asserted is a generous one (every connection closed by the
// server within 30 s, where the limits make it about 1 s), so that a slow
// machine does not fail it, while a server without an idle timeout (the
// keep-alive connections are never closed) or without a cap (all of them
// held at once) does.
func TestIdleConnections(t *testing.T) {
	const clients, maxConns = 40, 8
	lim := Limits{
		ReadHeaderTimeout: 300 * time.Millisecond,
		ReadTimeout:       time.Second,
		WriteTimeout:      time.Second,
		IdleTimeout:       200 * time.Millisecond,
		MaxHeaderBytes:    8 << 10,
		MaxConns:          maxConns,
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: raw}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := serveListener(ctx, cl, Handler(New("test"), func() error { return nil }), lim)

	deadline := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", raw.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(deadline)
			r := bufio.NewReader(c)
			if i%2 == 0 { // one request, then idle on a keep-alive connection
				fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: nri-gpu\r\n\r\n")
				resp, err := http.ReadResponse(r, nil)
				if closedByServer(err) {
					return // replaced by a newer connection before its request was read
				}
				if err != nil {
					errs <- fmt.Errorf("client %d: %v", i, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("client %d: %s", i, resp.Status)
					return
				}
			}
			// The server must close the connection: EOF, not our deadline.
			if _, err := r.ReadByte(); !closedByServer(err) {
				errs <- fmt.Errorf("client %d (keep-alive: %v): the server did not close the idle connection: %v", i, i%2 == 0, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if failed++; failed <= 3 {
			t.Error(err)
		}
	}
	if failed > 3 {
		t.Errorf("and %d more", failed-3)
	}
	for cl.held.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d clients: at most %d connections held at once, %d still held", clients, cl.max.Load(), cl.held.Load())
	// The one just accepted counts until the one it replaces (or itself)
	// is closed.
	if m := cl.max.Load(); m > maxConns+1 {
		t.Errorf("the server held %d connections at once, more than MaxConns %d + 1", m, maxConns)
	}
	if n := cl.held.Load(); n != 0 {
		t.Errorf("%d connections still held after every client was closed", n)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// closedByServer reports whether a client's read error is the server
// closing the connection (EOF, or a reset when it closed with data
// unread), not the client's own deadline.
func closedByServer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// TestServeLimits checks that Serve and ServeLimits listen and answer.
func TestServeLimits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, errc, err := Serve(ctx, "127.0.0.1:0", Handler(New("test"), func() error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, "http://"+addr.String()+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// attack keeps one connection to addr from source the way kind says until
// ctx ends, opening a new one whenever the server closes it: 0 sends one
// request and stays idle; 1 sends a request every 100 ms; 2 sends a
// request's headers a byte every 100 ms, never ending them; 3 sends
// nothing.
func attack(ctx context.Context, addr string, source net.IP, kind int) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: source}}
	for ctx.Err() == nil {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		r := bufio.NewReader(c)
		get := func() error {
			if _, err := fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: nri-gpu\r\n\r\n"); err != nil {
				return err
			}
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			return resp.Body.Close()
		}
		switch kind {
		case 0:
			if get() == nil {
				r.ReadByte() // until the server closes it
			}
		case 1:
			for get() == nil && sleepCtx(ctx, 100*time.Millisecond) {
			}
		case 2:
			for _, b := range []byte("GET /healthz HTTP/1.1\r\nHost: nri-gpu\r\nX-Slow: " + strings.Repeat("a", 4000)) {
				if _, err := c.Write([]byte{b}); err != nil || !sleepCtx(ctx, 100*time.Millisecond) {
					break
				}
			}
		case 3:
			r.ReadByte()
		}
		stop()
		c.Close()
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// sleepCtx sleeps d, or less when ctx ends; it reports whether ctx is
// still going.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// TestProbesGetThrough: whatever clients do with the metrics port, the
// kubelet's probes get their answer within the probe's timeout (1 s, the
// kubelet's default). Against the shipped limits (DefaultLimits): 300
// connections from one client address (a pod), a quarter each idle after
// one request, re-sending a request every 100 ms, sending a request's
// headers a byte every 100 ms, and silent, each opened again as soon as the
// server closes it; then the same spread over 40 addresses. Meanwhile
// /healthz and /readyz, each on a new connection as the kubelet's prober
// does, from another address, every 100 ms: every one is answered, and
// the server never holds more than MaxConns (plus the one just accepted).
func TestProbesGetThrough(t *testing.T) {
	if e := os.Getenv("NRI_GPU_TEST_EMULATED"); e != "" {
		t.Skipf("under %s (make test-arm64): the probes' 1 s timeout against 300 connections measures the emulator's speed, not the server's limits", e)
	}
	for _, tc := range []struct {
		name    string
		sources int
	}{{"one client", 1}, {"40 clients", 40}} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cl := &countingListener{Listener: raw}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := serveListener(ctx, cl, Handler(New("test"), func() error { return nil }), DefaultLimits)
			addr := raw.Addr().String()

			actx, stopAttack := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for i := range 300 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					attack(actx, addr, net.IPv4(127, 0, 1, byte(1+i%tc.sources)), i%4)
				}()
			}
			time.Sleep(time.Second) // the attack in place

			probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true,
				DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}).DialContext}}
			var failed []string
			slowest := time.Duration(0)
			for i := range 20 {
				path := []string{"/healthz", "/readyz"}[i%2]
				start := time.Now()
				resp, err := probe.Get("http://" + addr + path)
				took := time.Since(start)
				slowest = max(slowest, took)
				if err != nil {
					failed = append(failed, fmt.Sprintf("%s: %v", path, err))
				} else {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failed = append(failed, path+": "+resp.Status)
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			stopAttack()
			wg.Wait()
			t.Logf("%d sources, 300 connections: %d of 20 probes failed, the slowest answered in %s; at most %d connections held at once",
				tc.sources, len(failed), slowest.Round(time.Millisecond), cl.max.Load())
			for _, f := range failed {
				t.Errorf("probe: %s", f)
			}
			if m := cl.max.Load(); m > int64(DefaultLimits.MaxConns)+1 {
				t.Errorf("held %d connections at once, more than MaxConns %d + 1", m, DefaultLimits.MaxConns)
			}
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
}
