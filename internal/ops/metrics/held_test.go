package metrics

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rssKiB is this process's resident memory.
func rssKiB() int {
	data, _ := os.ReadFile("/proc/self/status")
	for l := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return 0
}

// TestHeldConnections is a measurement, not a check: with
// NRI_GPU_HELD_CONNS=N it opens N keep-alive connections that each send one
// request and then stay idle, and logs how many the server holds and how
// much resident memory the process grew by (client side included), within
// DefaultLimits, or with NRI_GPU_HELD_LIMITS=none without bounds (only the
// 5 s header timeout the listener had before Limits); one per process, so
// that the figures do not mix:
//
//	NRI_GPU_HELD_CONNS=3000 NRI_GPU_HELD_LIMITS=none go test -count=1 -run TestHeldConnections -v ./metrics/
//	NRI_GPU_HELD_CONNS=3000 go test -count=1 -run TestHeldConnections -v ./metrics/
func TestHeldConnections(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("NRI_GPU_HELD_CONNS"))
	if n <= 0 {
		t.Skip("a measurement: set NRI_GPU_HELD_CONNS to a number of connections")
	}
	name, lim := "DefaultLimits", DefaultLimits
	if os.Getenv("NRI_GPU_HELD_LIMITS") == "none" {
		name, lim = "no limits", Limits{ReadHeaderTimeout: 5 * time.Second}
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: raw}
	ctx, cancel := context.WithCancel(context.Background())
	serveListener(ctx, cl, Handler(New("test"), func() error { return nil }), lim)
	runtime.GC()
	before := rssKiB()
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, "GET /metrics HTTP/1.1\r\nHost: nri-gpu\r\n\r\n")
		conns = append(conns, c)
	}
	served := 0
	answered := time.Now().Add(2 * time.Second) // those beyond the cap wait unanswered
	for _, c := range conns {
		c.SetReadDeadline(answered)
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			resp.Body.Close()
			served++
		}
	}
	time.Sleep(time.Second)
	runtime.GC()
	t.Logf("%s: %d idle keep-alive clients: %d served, %d connections held (at most %d at once), resident memory +%d KiB",
		name, n, served, cl.held.Load(), cl.max.Load(), rssKiB()-before)
	for _, c := range conns {
		c.Close()
	}
	cancel()
}
