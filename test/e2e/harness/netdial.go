package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// DialContext dials addr from inside the network namespace: a socket is
// made in the namespace of the thread that makes it, so the dial runs on
// a locked thread moved into the namespace and back (a thread that
// cannot move back is left to end with its goroutine). The connection
// then works from any goroutine. For a Go client of the cluster's API
// server (RESTConfig), which is on no address of the host.
func (n *Namespaces) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if n == nil || !n.Net {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		restore, err := setNetNS(n.PID)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if restore() == nil {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}

// setNetNS moves the calling (locked) thread into the network namespace
// of pid and returns the function that moves it back.
func setNetNS(pid int) (func() error, error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	target, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		self.Close()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		self.Close()
		return nil, fmt.Errorf("setns to the network namespace of %d: %w", pid, err)
	}
	return func() error {
		defer self.Close()
		return unix.Setns(int(self.Fd()), unix.CLONE_NEWNET)
	}, nil
}

// RESTConfig is the cluster admin's client configuration for a Go client
// in this process, dialing into the cluster's network namespace, with
// qps and burst as client-go's rate limit (0: client-go's 5 and 10).
func (c *Cluster) RESTConfig(qps float32, burst int) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = qps, burst
	cfg.Dial = c.Net.NS.DialContext
	return cfg, nil
}
