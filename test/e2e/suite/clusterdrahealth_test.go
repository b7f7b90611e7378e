package suite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// featureGatesEnv, when set, is every cluster component's --feature-gates
// ("ResourceHealthStatus=true" runs the health checks at 1.34, where the
// gate is alpha and off).
const featureGatesEnv = "NRI_GPU_E2E_FEATURE_GATES"

// gateOn reports whether featureGatesEnv turns gate on.
func gateOn(gate string) bool {
	for _, g := range strings.Split(os.Getenv(featureGatesEnv), ",") {
		if k, v, _ := strings.Cut(strings.TrimSpace(g), "="); k == gate {
			on, _ := strconv.ParseBool(v)
			return on
		}
	}
	return false
}

// healthWatchLine is what nri-gpu logs when the kubelet opens its device
// health stream (dra.Driver.WatchHealthStatus).
const healthWatchLine = "the kubelet watches device health"

// deviceHealth is what the cluster says of one claim device's health:
// its taint in nri-gpu's ResourceSlice ("absent" when the slice leaves it
// out, "" when untainted) and its entry in the pod's
// allocatedResourcesStatus ("" when there is none).
type deviceHealth struct {
	taint, health, message, resourceID string
}

// podDeviceHealth reads the ResourceSlice's device dev of gpu-a and the
// allocatedResourcesStatus of pod's container main.
func podDeviceHealth(k kc, pod, dev string) (deviceHealth, error) {
	var h deviceHealth
	var err error
	if h.taint, err = sliceTaint(k, dev); err != nil {
		return h, err
	}
	p, err := k.c.GetPod(k.ctx, draNS, pod)
	if err != nil {
		return h, err
	}
	for _, cs := range p.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			if cs.Name != "main" || rs.Name != "claim:gpu" {
				continue
			}
			for _, r := range rs.Resources {
				h.health, h.resourceID = string(r.Health), string(r.ResourceID)
				if r.Message != nil {
					h.message = *r.Message
				}
			}
		}
	}
	return h, nil
}

// sliceTaint is the taints of device dev of gpu-a's slice
// (taintString), "absent" when the slice leaves it out.
func sliceTaint(k kc, dev string) (string, error) {
	devs, err := sliceDevices(k, "gpu-a")
	if err != nil {
		return "", err
	}
	for _, d := range devs {
		if d.Name == dev {
			return taintString(d.Taints), nil
		}
	}
	return "absent", nil
}

// taintString is a device's taints as key=value:effect, "" for none.
func taintString(ts []resourceapi.DeviceTaint) string {
	var out []string
	for _, t := range ts {
		out = append(out, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
	}
	return strings.Join(out, ",")
}

// waitHealth waits until what the cluster says of the device satisfies
// ok and returns it and how long it took from since.
func waitHealth(k kc, pod, dev, what string, since time.Time, timeout time.Duration, ok func(deviceHealth) bool) (deviceHealth, time.Duration) {
	k.t.Helper()
	var h deviceHealth
	k.wait(timeout, what, func() (bool, string, error) {
		var err error
		h, err = podDeviceHealth(k, pod, dev)
		if err != nil {
			return false, err.Error(), nil
		}
		return ok(h), fmt.Sprintf("%+v", h), nil
	})
	return h, time.Since(since)
}

// testDRAHealth: a pod whose claim holds gpu-a's GPU 0; the simulated
// NVML then reports XID 79 on that GPU, then the GPU lost, then usable
// again (a reset). Where the kubelet watches nri-gpu's health stream
// (feature gate ResourceHealthStatus: beta and on from 1.36; alpha and
// off at 1.34, where featureGatesEnv can turn it on), the pod's
// status.containerStatuses[main].allocatedResourcesStatus has the claim's
// device (its CDI device ID) Healthy before the XID, Unhealthy after it
// (from 1.36 with the message "XID 79", then NVML's message of a lost
// GPU: ResourceHealthStatusMessage), and Healthy again after the reset.
// Where it does not, the pod's status has no allocatedResourcesStatus
// and nri-gpu's log no health stream. The slice's device carries
// gpu.nvidia.com/xid=79, then gpu-lost, then no taint (DRADeviceTaints:
// from 1.36), or is left out of the slice until the reset (1.34). The
// node's NVML state is put back after. It is one piece: each step waits
// on the state the one before left on the same GPU (XID, loss, reset),
// and its cleanup must reset the GPU in that order.
func testDRAHealth(k kc, version string) {
	t := k.t
	a := k.c.Node("gpu-a")
	g := a.GPU.GPUs[0]
	dev := fmt.Sprintf("gpu-%d", g.Minor)
	health := minorVersion(version) >= 36 || gateOn("ResourceHealthStatus")
	message := minorVersion(version) >= 36
	taints := minorVersion(version) >= 36 || gateOn("DRADeviceTaints")
	t.Logf("Kubernetes %s: health in pod status %v, with messages %v; device taints %v", version, health, message, taints)
	path := a.GPU.HostPath(simnode.NVMLStatePath)
	saved, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	st := simnode.NVMLState{GPUs: make([]simnode.NVMLGPU, len(a.GPU.GPUs))}
	t.Cleanup(func() {
		// A GPU left unhealthy is reset first (lost, then usable), so
		// that nri-gpu takes it back for the checks after this one.
		if taint, err := sliceTaint(k, dev); err == nil && taint != "" {
			lostLines := strings.Count(nriGPULogs(k, "gpu-a"), "unhealthy: NVML: ")
			st.GPUs[0] = simnode.NVMLGPU{Lost: true}
			_ = a.GPU.WriteNVMLState(st)
			_ = harness.WaitFor(k.ctx, time.Minute, "GPU 0 lost", func() (bool, string, error) {
				return strings.Count(nriGPULogs(k, "gpu-a"), "unhealthy: NVML: ") > lostLines, "", nil
			})
			st.GPUs[0] = simnode.NVMLGPU{}
			_ = a.GPU.WriteNVMLState(st)
			_ = harness.WaitFor(k.ctx, time.Minute, "GPU 0 back", func() (bool, string, error) {
				taint, err := sliceTaint(k, dev)
				return err == nil && taint == "", fmt.Sprint(taint, err), nil
			})
		}
		_, _ = k.c.Kubectl(k.ctx, "delete", "pod", "-n", draNS, "sick", "--ignore-not-found", "--wait=true", "--timeout=2m")
		if saved != nil {
			err = os.WriteFile(path, saved, 0o644)
		} else {
			err = os.Remove(path)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Error(err)
		}
	})
	// The slice's device: tainted with want, or left out where the API
	// server has no device taints.
	tainted := func(want string) func(deviceHealth) bool {
		return func(h deviceHealth) bool { return taints && h.taint == want || !taints && h.taint == "absent" }
	}

	k.apply(claimPod("sick", 1, fmt.Sprintf("device.attributes['gpu.nvidia.com'].uuid == '%s'", g.UUID)))
	v := viewClaimPod(k, "sick")
	if v.pod.Spec.NodeName != "gpu-a" || len(v.assigned) != 1 || v.assigned[0] != g.UUID {
		t.Fatalf("pod sick on %s with %v, want gpu-a's GPU 0 (%s)", v.pod.Spec.NodeName, v.assigned, g.UUID)
	}
	resourceID := fmt.Sprintf("k8s.%s/claim=%s-%s", draDriver, v.claims[0], dev)
	if health {
		h, _ := waitHealth(k, "sick", dev, "the pod's allocatedResourcesStatus: the claim's GPU Healthy", time.Now(), time.Minute, func(h deviceHealth) bool {
			return h.health == string(corev1.ResourceHealthStatusHealthy)
		})
		if h.resourceID != resourceID || h.message != "" || h.taint != "" {
			t.Errorf("before the XID: %+v, want resource %s Healthy, no message, no taint", h, resourceID)
		}
	}

	// XID 79 (fallen off the bus) on GPU 0.
	st.Events = []simnode.XID{{GPU: 0, XID: 79, GI: -1, CI: -1}}
	xid := time.Now()
	if err := a.GPU.WriteNVMLState(st); err != nil {
		t.Fatal(err)
	}
	if health {
		h, took := waitHealth(k, "sick", dev, "the pod's allocatedResourcesStatus: the claim's GPU Unhealthy after XID 79", xid, 30*time.Second, func(h deviceHealth) bool {
			return h.health == string(corev1.ResourceHealthStatusUnhealthy)
		})
		t.Logf("XID 79 -> the pod's status Unhealthy in %s", took.Round(100*time.Millisecond))
		want := ""
		if message {
			want = "XID 79"
		}
		if h.resourceID != resourceID || h.message != want {
			t.Errorf("after the XID: %+v, want resource %s Unhealthy with message %q", h, resourceID, want)
		}
		if log := nriGPULogs(k, "gpu-a"); !strings.Contains(log, healthWatchLine) {
			t.Errorf("nri-gpu's log has no %q", healthWatchLine)
		}
	}
	h, took := waitHealth(k, "sick", dev, "the XID's device tainted xid=79, or left out of the slice", xid, 30*time.Second, tainted("gpu.nvidia.com/xid=79:NoSchedule"))
	t.Logf("XID 79 -> the slice's device %q in %s", h.taint, took.Round(100*time.Millisecond))
	if !health {
		// The kubelet's pod status sync would have had time to say it.
		time.Sleep(3 * time.Second)
		if h, _ = podDeviceHealth(k, "sick", dev); h.health != "" {
			t.Errorf("Kubernetes %s without ResourceHealthStatus: the pod's status has %+v", version, h)
		}
		if log := nriGPULogs(k, "gpu-a"); strings.Contains(log, healthWatchLine) {
			t.Errorf("Kubernetes %s without ResourceHealthStatus: the kubelet opened nri-gpu's health stream", version)
		}
	}

	// A reset: NVML reports the GPU lost (at nri-gpu's next rediscovery,
	// every 30 s), then usable again.
	lostLines := strings.Count(nriGPULogs(k, "gpu-a"), "unhealthy: NVML: ")
	st.GPUs[0] = simnode.NVMLGPU{Lost: true}
	lost := time.Now()
	if err := a.GPU.WriteNVMLState(st); err != nil {
		t.Fatal(err)
	}
	k.wait(90*time.Second, "nri-gpu: GPU 0 lost", func() (bool, string, error) {
		return strings.Count(nriGPULogs(k, "gpu-a"), "unhealthy: NVML: ") > lostLines, "", nil
	})
	t.Logf("GPU lost -> nri-gpu says so in %s", time.Since(lost).Round(100*time.Millisecond))
	if message {
		h, _ := waitHealth(k, "sick", dev, "the pod's status: the GPU lost", lost, 30*time.Second, func(h deviceHealth) bool { return strings.HasPrefix(h.message, "NVML: ") })
		if h.health != string(corev1.ResourceHealthStatusUnhealthy) || !strings.Contains(h.message, "lost") {
			t.Errorf("GPU lost: %+v, want Unhealthy, NVML's message of a lost GPU", h)
		}
	}
	waitHealth(k, "sick", dev, "the lost GPU tainted gpu-lost, or left out of the slice", lost, 30*time.Second, tainted("gpu.nvidia.com/gpu-lost=:NoSchedule"))
	st.GPUs[0] = simnode.NVMLGPU{}
	back := time.Now()
	if err := a.GPU.WriteNVMLState(st); err != nil {
		t.Fatal(err)
	}
	if health {
		h, took := waitHealth(k, "sick", dev, "the pod's status: the GPU Healthy again", back, 90*time.Second, func(h deviceHealth) bool {
			return h.health == string(corev1.ResourceHealthStatusHealthy)
		})
		t.Logf("GPU usable again -> the pod's status Healthy in %s (nri-gpu rediscovers every 30 s)", took.Round(100*time.Millisecond))
		if h.message != "" || h.resourceID != resourceID {
			t.Errorf("recovered: %+v", h)
		}
	}
	_, took = waitHealth(k, "sick", dev, "the slice's device back, untainted", back, 90*time.Second, func(h deviceHealth) bool { return h.taint == "" })
	t.Logf("GPU usable again -> the slice's device back, untainted, in %s", took.Round(100*time.Millisecond))
}
