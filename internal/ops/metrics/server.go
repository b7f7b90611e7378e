package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultHost is where the listener binds when --metrics-addr names only
// a port: the loopback interface, so that metrics are not exposed to the
// network unless asked for.
const DefaultHost = "127.0.0.1"

// NormalizeAddr turns a --metrics-addr value into a listen address: a
// bare port ("9400") or a port without host (":9400") listens on
// DefaultHost; "0.0.0.0:9400" or "[::]:9400" listen on every interface.
// Port 0 picks a free port (the log says which).
func NormalizeAddr(addr string) (string, error) {
	if _, err := strconv.ParseUint(addr, 10, 16); err == nil {
		addr = ":" + addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q is not HOST:PORT or PORT: %v", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("%q: port %q must be a number from 0 to 65535 (0: any free port)", addr, port)
	}
	if host == "" {
		host = DefaultHost
	}
	return net.JoinHostPort(host, port), nil
}

// Handler serves /metrics (Prometheus text format), /healthz (200 while
// the process serves HTTP) and /readyz (200 when notReady returns nil,
// else 503 with its reason); nri_gpu_ready follows the same notReady, so
// that an alert sees what the readiness probe sees.
func Handler(m *Metrics, notReady func() error) http.Handler {
	m.notReady.Store(&notReady)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := notReady(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Limits bound what clients of the listener can hold. Anything that can
// reach the port can open connections (the shipped DaemonSet listens on
// the pod's address, which every pod of the cluster can reach), and each
// held connection costs a goroutine and its buffers; the kubelet's probes
// and Prometheus must get through whatever one client does. See guard for
// how the connection limits are kept without making a connection wait.
type Limits struct {
	// ReadHeaderTimeout bounds how long a client may take to send a
	// request's headers, from its first byte.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request; WriteTimeout writing
	// its answer.
	ReadTimeout, WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request before the server closes it.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes int
	// MaxConns is the most connections held at once: at the cap, a new
	// connection replaces the one idle longest (or waiting longest for
	// its first request); none waits in the kernel's accept queue.
	MaxConns int
	// MaxConnsPerSource is the most connections held at once from one
	// client address; more are closed as they come.
	MaxConnsPerSource int
}

// DefaultLimits are the listener's bounds: room for the kubelet's probes
// and a few Prometheus scrapers (a scrape takes milliseconds), while 64
// held connections cost this process about 2 MiB at most (4 KiB read and
// write buffers, 8 KiB of headers and a goroutine each). One client
// holds at most 8 of them: the kubelet opens one connection per probe, a
// Prometheus one per scrape.
var DefaultLimits = Limits{
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       10 * time.Second,
	WriteTimeout:      10 * time.Second,
	IdleTimeout:       30 * time.Second,
	MaxHeaderBytes:    8 << 10,
	MaxConns:          64,
	MaxConnsPerSource: 8,
}

// Serve listens on addr and serves h until ctx is cancelled, within
// DefaultLimits. It returns once listening (an address in use is an error
// then), with the bound address; errors after that are sent on the
// returned channel.
func Serve(ctx context.Context, addr string, h http.Handler) (net.Addr, <-chan error, error) {
	return ServeLimits(ctx, addr, h, DefaultLimits)
}

// ServeLimits is Serve within lim.
func ServeLimits(ctx context.Context, addr string, h http.Handler, lim Limits) (net.Addr, <-chan error, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	return l.Addr(), serveListener(ctx, l, h, lim), nil
}

// serveListener serves h on l within lim until ctx is cancelled.
func serveListener(ctx context.Context, l net.Listener, h http.Handler, lim Limits) <-chan error {
	g := newGuard(l, lim)
	srv := &http.Server{
		ConnState:         g.track,
		Handler:           h,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout:       lim.ReadTimeout,
		WriteTimeout:      lim.WriteTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
	}
	errc := make(chan error, 1)
	go func() {
		err := srv.Serve(g)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		errc <- err
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		// Requests still open after the timeout are dropped with the
		// listener: nothing to report at exit.
		_ = srv.Shutdown(sctx)
	}()
	return errc
}
