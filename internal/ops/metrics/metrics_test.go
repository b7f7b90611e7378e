package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/inventory"
)

func TestNormalizeAddr(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"9400", "127.0.0.1:9400", ""},
		{":9400", "127.0.0.1:9400", ""},
		{"0.0.0.0:9400", "0.0.0.0:9400", ""},
		{"[::]:9400", "[::]:9400", ""},
		{"localhost:0", "localhost:0", ""},
		{"127.0.0.1", "", "is not HOST:PORT or PORT"},
		{":http", "", `port "http" must be a number`},
		{"70000", "", "is not HOST:PORT or PORT"},
	} {
		got, err := NormalizeAddr(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("NormalizeAddr(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("NormalizeAddr(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestScrape records what a plugin would report and scrapes it over HTTP.
func TestScrape(t *testing.T) {
	m := New("v1.2.3")
	var notReady = errors.New("not connected to the runtime")
	srv := httptest.NewServer(Handler(m, func() error { return notReady }))
	defer srv.Close()

	gpus := []inventory.GPU{{Index: 0, UUID: "GPU-a"}, {Index: 2, UUID: "GPU-c"}}
	m.Inventory(&inventory.Snapshot{DriverVersion: "580.126.09", GPUs: make([]inventory.GPU, 4), Files: make([]inventory.DriverFile, 25)})
	m.Request("container-annotation", "injected", gpus, 12*time.Microsecond)
	m.Request("env", "injected", gpus[1:], 30*time.Microsecond)
	m.Request("pod-annotation", "refused", nil, 8*time.Microsecond)
	m.Request("none", "untouched", nil, time.Microsecond)
	m.Refresh("changed")
	m.Refresh("rejected")
	m.Refresh("rejected")
	m.Connected()
	m.Connected()
	m.SetAllocations(func() []Allocation {
		return []Allocation{{Index: 0, UUID: "GPU-a", Holders: 2}, {Index: 1, UUID: "GPU-b"}, {Index: inventory.MIGKey(3, 1), UUID: "MIG-d", Holders: 1}}
	})
	m.Request("device-list", "injected", []inventory.GPU{{Index: inventory.MIGKey(3, 1), UUID: "MIG-d"}}, time.Microsecond)
	m.XID(79, true)
	m.XID(13, false)
	m.Unhealthy(map[string]string{"GPU-b": "XID 79"})

	code, body := get(t, srv.URL+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`nri_gpu_requests_total{outcome="injected",source="container-annotation"} 1`,
		`nri_gpu_requests_total{outcome="injected",source="env"} 1`,
		`nri_gpu_requests_total{outcome="refused",source="pod-annotation"} 1`,
		`nri_gpu_requests_total{outcome="untouched",source="none"} 1`,
		`nri_gpu_gpus_injected_total 4`,
		`nri_gpu_gpu_injections_total{index="3:1",uuid="MIG-d"} 1`,
		`nri_gpu_gpu_allocations{index="3:1",uuid="MIG-d"} 1`,
		`nri_gpu_xid_events_total{critical="true",xid="79"} 1`,
		`nri_gpu_xid_events_total{critical="false",xid="13"} 1`,
		`nri_gpu_device_unhealthy{reason="XID 79",uuid="GPU-b"} 1`,
		`nri_gpu_gpu_injections_total{index="0",uuid="GPU-a"} 1`,
		`nri_gpu_gpu_injections_total{index="2",uuid="GPU-c"} 2`,
		`nri_gpu_request_duration_seconds_count 5`,
		`nri_gpu_request_duration_seconds_bucket{le="1e-05"} 3`,
		`nri_gpu_inventory_refreshes_total{result="changed"} 1`,
		`nri_gpu_inventory_refreshes_total{result="rejected"} 2`,
		`nri_gpu_runtime_connections_total 2`,
		`nri_gpu_driver_info{version="580.126.09"} 1`,
		`nri_gpu_inventory_gpus 4`,
		`nri_gpu_inventory_driver_files 25`,
		`nri_gpu_gpu_allocations{index="0",uuid="GPU-a"} 2`,
		`nri_gpu_gpu_allocations{index="1",uuid="GPU-b"} 0`,
		`nri_gpu_build_info{version="v1.2.3"} 1`,
		`nri_gpu_ready 0`,
		`process_resident_memory_bytes `,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// A new snapshot replaces the driver version rather than adding one.
	m.Inventory(&inventory.Snapshot{DriverVersion: "590.44.01"})
	_, body = get(t, srv.URL+"/metrics")
	if strings.Contains(body, `version="580.126.09"`) || !strings.Contains(body, `nri_gpu_driver_info{version="590.44.01"} 1`) {
		t.Errorf("driver info after refresh:\n%s", grep(body, "nri_gpu_driver_info"))
	}

	if code, body := get(t, srv.URL+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, srv.URL+"/readyz"); code != 503 || !strings.Contains(body, "not ready: not connected to the runtime") {
		t.Errorf("/readyz while not ready: %d %q", code, body)
	}
	notReady = nil
	if code, body := get(t, srv.URL+"/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz when ready: %d %q", code, body)
	}
	if _, body := get(t, srv.URL+"/metrics"); !strings.Contains(body, "\nnri_gpu_ready 1\n") {
		t.Errorf("ready, and /metrics says:\n%s", grep(body, "nri_gpu_ready"))
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestServe checks the listener: it binds, serves and stops with its
// context, and an address in use is an error at start.
func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	m := New("dev")
	addr, errc, err := Serve(ctx, "127.0.0.1:0", Handler(m, func() error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, "http://"+addr.String()+"/readyz"); code != 200 {
		t.Errorf("/readyz: %d", code)
	}
	if _, _, err := Serve(ctx, addr.String(), Handler(m, nil)); err == nil {
		t.Error("a second listener on the same address succeeded")
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("server stopped with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server did not stop with its context")
	}
}
