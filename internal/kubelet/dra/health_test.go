package dra

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// health is one device's health as the kubelet receives it.
type health struct {
	Device, Health, Message string
}

// healthStream reads the kubelet's DRAResourceHealth stream of one
// version, as the kubelet does, into reports.
type healthStream struct {
	reports chan []health
	errs    chan error
}

// watchHealth opens the driver's health stream of version "v1" or
// "v1alpha1" on its socket, as the kubelet does after registration.
func watchHealth(t *testing.T, e *testEnv, version string) *healthStream {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+filepath.Join(e.dirs.PluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = cc.Close() })
	s := &healthStream{reports: make(chan []health, 16), errs: make(chan error, 1)}
	switch version {
	case "v1":
		st, err := drahealthv1.NewDRAResourceHealthClient(cc).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				r, err := st.Recv()
				if err != nil {
					s.errs <- err
					return
				}
				var hs []health
				for _, d := range r.GetDevices() {
					if d.GetDevice().GetPoolName() != testNode || d.GetLastUpdatedTime() == 0 {
						s.errs <- fmt.Errorf("device %v: pool or time", d)
						return
					}
					hs = append(hs, health{d.GetDevice().GetDeviceName(), d.GetHealth().String(), d.GetMessage()})
				}
				s.reports <- hs
			}
		}()
	case "v1alpha1":
		st, err := drahealthv1alpha1.NewDRAResourceHealthClient(cc).NodeWatchResources(ctx, &drahealthv1alpha1.NodeWatchResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				r, err := st.Recv()
				if err != nil {
					s.errs <- err
					return
				}
				var hs []health
				for _, d := range r.GetDevices() {
					if d.GetDevice().GetPoolName() != testNode {
						s.errs <- fmt.Errorf("device %v: pool", d)
						return
					}
					hs = append(hs, health{d.GetDevice().GetDeviceName(), d.GetHealth().String(), d.GetMessage()})
				}
				s.reports <- hs
			}
		}()
	}
	return s
}

// next is the stream's next report (within 5 s).
func (s *healthStream) next(t *testing.T) []health {
	t.Helper()
	select {
	case r := <-s.reports:
		return r
	case err := <-s.errs:
		t.Fatalf("health stream: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no health report within 5 s")
	}
	return nil
}

// allHealthy is every device of the test snapshot, healthy.
func allHealthy() []health {
	return []health{{"gpu-0", "HEALTHY", ""}, {"gpu-2", "HEALTHY", ""}, {"gpu-1-mig-1g10gb-19-4", "HEALTHY", ""}, {"gpu-1-mig-1g10gb-19-5", "HEALTHY", ""}}
}

// TestHealthService: the kubelet's DRAResourceHealth stream, read on the
// plugin's socket in both versions the helper serves (v1, which a 1.37
// kubelet picks, and v1alpha1, the only one a 1.34-1.36 kubelet asks
// for): every published device healthy at once; an XID on GPU 0 and a
// lost GPU under MIG device 19-5 (the node state's Unhealthy, which the
// slices' taints come from) make those Unhealthy with the reason as the
// message; recovery makes them Healthy again; a prepared claim's device
// that the node no longer has is Unhealthy.
func TestHealthService(t *testing.T) {
	for _, version := range []string{"v1", "v1alpha1"} {
		t.Run(version, func(t *testing.T) {
			e := newEnv(t, draConfig(), testSnapshot(), nil)
			s := watchHealth(t, e, version)
			if diff := cmp.Diff(allHealthy(), s.next(t)); diff != "" {
				t.Fatalf("first report (-want +got):\n%s", diff)
			}
			st := *e.n.State()
			st.Unhealthy = map[string]string{"GPU-aaaaaaaa": "XID 79", "MIG-nnnnnnnn": "NVML: nvmlDeviceGetUUID: GPU is lost (15) on its GPU GPU-bbbbbbbb"}
			e.n.Swap(&st)
			want := allHealthy()
			want[0] = health{"gpu-0", "UNHEALTHY", "XID 79"}
			want[3] = health{"gpu-1-mig-1g10gb-19-5", "UNHEALTHY", "NVML: nvmlDeviceGetUUID: GPU is lost (15) on its GPU GPU-bbbbbbbb"}
			if diff := cmp.Diff(want, s.next(t)); diff != "" {
				t.Errorf("after the XID (-want +got):\n%s", diff)
			}
			st.Unhealthy = nil
			e.n.Swap(&st)
			if diff := cmp.Diff(allHealthy(), s.next(t)); diff != "" {
				t.Errorf("recovered (-want +got):\n%s", diff)
			}
			// A claim prepared on gpu-2, then GPU 2 gone from the node.
			e.prepare(t, e.claim(t, "train", "uid-1", false, "gpu-2"))
			gone := testSnapshot()
			gone.GPUs = gone.GPUs[:2]
			e.n.Swap(stateOf(gone, draConfig()))
			want = allHealthy()
			want = append(slices.Delete(want, 1, 2), health{"gpu-2", "UNHEALTHY", notOnNode})
			if diff := cmp.Diff(want, s.next(t)); diff != "" {
				t.Errorf("GPU 2 gone (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHealthResend: nothing changing, the same report comes again every
// resend interval (the kubelet takes an unrefreshed device for Unknown
// after 30 s); a state change that changes nobody's health sends nothing.
func TestHealthResend(t *testing.T) {
	opts := envOptions(t)
	opts.HealthResend = 300 * time.Millisecond
	e := newEnv(t, draConfig(), testSnapshot(), &opts)
	s := watchHealth(t, e, "v1")
	start := time.Now()
	first := s.next(t)
	st := *e.n.State()
	e.n.Swap(&st) // the same health
	second := s.next(t)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("the second report came %s after the first: a change of nobody's health sent one", d)
	}
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("resent report (-first +second):\n%s", diff)
	}
}

// TestHealthRegistered: the registration the kubelet reads advertises
// the health service in both versions beside the DRA service.
func TestHealthRegistered(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	cc, err := grpc.NewClient("unix://"+filepath.Join(e.dirs.RegistrationDir, testDriver+"-reg.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	info, err := registerapi.NewRegistrationClient(cc).GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range []string{drahealthv1.DRAResourceHealthService, drahealthv1alpha1.DRAResourceHealthService} {
		if !slices.Contains(info.SupportedVersions, svc) {
			t.Errorf("registration advertises %v, not %s", info.SupportedVersions, svc)
		}
	}
}

// TestHealthReport: the report of a node state as a whole value, without
// gRPC: MIG devices unhealthy with their GPU, a prepared claim's device
// the node lacks, published devices first (GPUs, then MIG devices), then the missing
// ones by name.
func TestHealthReport(t *testing.T) {
	d := &Driver{nodeName: testNode}
	d.ckpt.Claims = map[string]checkpointClaim{"uid-1": {Devices: []checkpointDevice{{Device: "gpu-9"}, {Device: "gpu-0"}}}}
	st := stateOf(testSnapshot(), draConfig())
	st.Unhealthy = map[string]string{"MIG-mmmmmmmm": "XID 48 on its GPU GPU-bbbbbbbb", "MIG-nnnnnnnn": "XID 48 on its GPU GPU-bbbbbbbb"}
	now := time.Unix(1700000000, 0)
	var got []health
	for _, h := range d.healthReport(st, now).Devices {
		if h.PoolName != testNode || !h.LastUpdated.Equal(now) || h.HealthCheckTimeout != 0 {
			t.Errorf("device %+v: pool, time or timeout", h)
		}
		got = append(got, health{h.DeviceName, string(h.Health), h.Message})
	}
	want := []health{{"gpu-0", "Healthy", ""}, {"gpu-2", "Healthy", ""}, {"gpu-1-mig-1g10gb-19-4", "Unhealthy", "XID 48 on its GPU GPU-bbbbbbbb"},
		{"gpu-1-mig-1g10gb-19-5", "Unhealthy", "XID 48 on its GPU GPU-bbbbbbbb"}, {"gpu-9", "Unhealthy", notOnNode}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if !sameHealth(d.healthReport(st, now), d.healthReport(st, now.Add(time.Hour))) {
		t.Error("two reports of one state at two times differ")
	}
}
