package metrics

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// guard keeps the listener's connections within Limits without ever
// making a new connection wait: the kubelet's probes and Prometheus arrive
// on new connections, and a connection left in the kernel's accept queue
// behind a full listener is a probe that times out (netutil.LimitListener
// did that: 64 idle clients took the probes down). So Accept takes every
// connection from the kernel at once, and then:
//
//   - a source address (one client: a pod, a host) holding
//     MaxConnsPerSource connections has its new one closed at once;
//   - at MaxConns, the new connection takes the place of the one idle
//     longest between two requests, else of the one that has waited
//     longest for its first request's headers (none of them has a request
//     in progress); only when every connection is in the middle of a
//     request (bounded by the write timeout) is the new one closed.
//
// The server's ConnState hook tells it each connection's state.
type guard struct {
	net.Listener
	perSource, max int

	mu       sync.Mutex
	conns    map[*guardedConn]bool
	bySource map[string]int
}

// guardedConn is a connection the guard counts until it is closed.
type guardedConn struct {
	net.Conn
	g      *guard
	source string
	once   sync.Once
	// state and since are the server's last word on the connection
	// (guarded by g.mu).
	state http.ConnState
	since time.Time
}

func newGuard(l net.Listener, lim Limits) *guard {
	return &guard{Listener: l, perSource: lim.MaxConnsPerSource, max: lim.MaxConns,
		conns: map[*guardedConn]bool{}, bySource: map[string]int{}}
}

// Accept returns the next connection the limits let in; those they do not
// are closed here, and Accept waits for the next.
func (g *guard) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := g.admit(c); gc != nil {
			return gc, nil
		}
		_ = c.Close()
	}
}

// admit counts c in, making room as the limits say, or returns nil.
func (g *guard) admit(c net.Conn) *guardedConn {
	source := sourceOf(c.RemoteAddr())
	g.mu.Lock()
	if g.perSource > 0 && g.bySource[source] >= g.perSource {
		g.mu.Unlock()
		return nil
	}
	var victim *guardedConn
	if g.max > 0 && len(g.conns) >= g.max {
		if victim = g.victim(); victim == nil {
			g.mu.Unlock()
			return nil
		}
		g.forget(victim)
	}
	gc := &guardedConn{Conn: c, g: g, source: source, state: http.StateNew, since: time.Now()}
	g.conns[gc] = true
	g.bySource[source]++
	g.mu.Unlock()
	if victim != nil {
		_ = victim.Conn.Close()
	}
	return gc
}

// victim returns the connection to close for a new one: idle longest,
// else waiting longest for its first request. The caller holds mu.
func (g *guard) victim() *guardedConn {
	var best *guardedConn
	for c := range g.conns {
		switch {
		case c.state != http.StateIdle && c.state != http.StateNew:
		case best == nil,
			c.state == http.StateIdle && best.state != http.StateIdle,
			c.state == best.state && c.since.Before(best.since):
			best = c
		}
	}
	return best
}

// forget stops counting c. The caller holds mu.
func (g *guard) forget(c *guardedConn) {
	if !g.conns[c] {
		return
	}
	delete(g.conns, c)
	if g.bySource[c.source]--; g.bySource[c.source] <= 0 {
		delete(g.bySource, c.source)
	}
}

// track is the server's ConnState hook.
func (g *guard) track(c net.Conn, s http.ConnState) {
	gc, ok := c.(*guardedConn)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if s == http.StateClosed || s == http.StateHijacked {
		g.forget(gc)
		return
	}
	gc.state, gc.since = s, time.Now()
}

// Close closes the connection and stops counting it.
func (c *guardedConn) Close() error {
	c.once.Do(func() {
		c.g.mu.Lock()
		c.g.forget(c)
		c.g.mu.Unlock()
	})
	return c.Conn.Close()
}

// sourceOf returns the client's address without its port: one pod, or one
// host.
func sourceOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
