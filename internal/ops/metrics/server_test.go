package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
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
// after its timeout and never holds more than MaxConns at once.
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
			if _, err := r.ReadByte(); err != io.EOF {
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
	if m := cl.max.Load(); m > maxConns {
		t.Errorf("the server held %d connections at once, more than MaxConns %d", m, maxConns)
	}
	if n := cl.held.Load(); n != 0 {
		t.Errorf("%d connections still held after every client was closed", n)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("serve: %v", err)
	}
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
