package scale

import (
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
)

// TestNVIDIAPluginArgs: the shares variant, and only it, turns on NVIDIA's
// ConsumableShares gate with --consumable-shares=memory; every variant
// has its own kubelet and CDI directories under work, the simulated
// node's root as both driver roots, and no healthcheck port.
func TestNVIDIAPluginArgs(t *testing.T) {
	for _, v := range Variants {
		args := nvidiaPluginArgs(v, "n", "/kc", "/sim", "/w/"+string(v), "/hook")
		flag := func(name string) string {
			i := slices.Index(args, name)
			if i < 0 || i+1 >= len(args) {
				return ""
			}
			return args[i+1]
		}
		gates, shares := flag("--feature-gates"), flag("--consumable-shares")
		if v == Shares && (gates != "ConsumableShares=true" || shares != "memory") {
			t.Errorf("%s: --feature-gates %q --consumable-shares %q, want ConsumableShares=true, memory", v, gates, shares)
		}
		if v != Shares && (gates != "" || shares != "") {
			t.Errorf("%s: --feature-gates %q --consumable-shares %q, want neither", v, gates, shares)
		}
		for f, want := range map[string]string{"--node-name": "n", "--kubeconfig": "/kc", "--nvidia-driver-root": "/sim",
			"--container-driver-root": "/sim", "--healthcheck-port": "-1", "--nvidia-cdi-hook-path": "/hook"} {
			if got := flag(f); got != want {
				t.Errorf("%s: %s %q, want %q", v, f, got, want)
			}
		}
		for _, f := range []string{"--cdi-root", "--kubelet-registrar-directory-path", "--kubelet-plugins-directory-path"} {
			if !strings.HasPrefix(flag(f), "/w/"+string(v)+"/") {
				t.Errorf("%s: %s %q, not under its work directory", v, f, flag(f))
			}
		}
	}
}

func dev(name string, attrs map[resourceapi.QualifiedName]string) resourceapi.Device {
	d := resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
	for k, v := range attrs {
		d.Attributes[k] = str(v)
	}
	return d
}

// TestCompareDevices: the same devices compare equal; a missing device,
// an extra one, an attribute in one only and one that differs are each
// named, with how many devices.
func TestCompareDevices(t *testing.T) {
	a := []resourceapi.Device{dev("gpu-0", map[resourceapi.QualifiedName]string{"type": "gpu", "brand": "Nvidia"}),
		dev("gpu-1", map[resourceapi.QualifiedName]string{"type": "gpu", "brand": "Nvidia"})}
	if d := CompareDevices(a, a); len(d) != 0 {
		t.Errorf("same devices: %q", d)
	}
	b := []resourceapi.Device{dev("gpu-0", map[resourceapi.QualifiedName]string{"type": "gpu", "brand": "NVIDIA", "pcieRoot": "pci0000:00"}),
		dev("gpu-2", map[resourceapi.QualifiedName]string{"type": "gpu"}), dev("gpu-3", nil)}
	got := strings.Join(CompareDevices(a, b), "\n")
	for _, want := range []string{"2 devices from the source, 3 captured", "devices only from the source: gpu-1",
		"devices only captured: gpu-2 gpu-3", `attribute brand differs on 1 devices (e.g. gpu-0: source {"string":"Nvidia"}, captured {"string":"NVIDIA"})`,
		"attribute pcieRoot only captured on 1 devices"} {
		if !strings.Contains(got, want) {
			t.Errorf("comparison lacks %q:\n%s", want, got)
		}
	}
}

// TestUseCaptured: captured variants replace the shape's devices, the
// others stay, and Source says which is which.
func TestUseCaptured(t *testing.T) {
	src := []resourceapi.Device{dev("gpu-0", nil)}
	s := &Shape{Name: "nvidia", Driver: NVIDIADriver, Source: "read", devices: map[Variant][]resourceapi.Device{Whole: src, Shares: src, MIG: src}}
	UseCaptured(s, nil, "nothing")
	if s.Source != "read" {
		t.Errorf("nothing captured: Source %q", s.Source)
	}
	real := []resourceapi.Device{dev("gpu-0", nil), dev("gpu-1", nil)}
	UseCaptured(s, map[Variant][]resourceapi.Device{Whole: real, MIG: real}, "run here")
	if s.DeviceCount(Whole) != 2 || s.DeviceCount(MIG) != 2 || s.DeviceCount(Shares) != 1 {
		t.Errorf("device counts %d %d %d, want 2 2 1", s.DeviceCount(Whole), s.DeviceCount(MIG), s.DeviceCount(Shares))
	}
	for _, want := range []string{"(run here) for gpu (2 devices), mig (2 devices)", "; shares as its source publishes it"} {
		if !strings.Contains(s.Source, want) {
			t.Errorf("Source %q lacks %q", s.Source, want)
		}
	}
}

// TestPoolComplete: a pool is whole when every slice of its newest
// generation is there and holds devices.
func TestPoolComplete(t *testing.T) {
	sl := func(gen, count int64, devs int) resourceapi.ResourceSlice {
		s := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: NVIDIADriver,
			Pool: resourceapi.ResourcePool{Name: "n", Generation: gen, ResourceSliceCount: count}}}
		for range devs {
			s.Spec.Devices = append(s.Spec.Devices, dev("d", nil))
		}
		return s
	}
	for _, c := range []struct {
		slices []resourceapi.ResourceSlice
		want   bool
	}{
		{nil, false},
		{[]resourceapi.ResourceSlice{sl(1, 1, 8)}, true},
		{[]resourceapi.ResourceSlice{sl(1, 1, 0)}, false},
		{[]resourceapi.ResourceSlice{sl(1, 2, 8)}, false},
		{[]resourceapi.ResourceSlice{sl(1, 1, 8), sl(2, 2, 4)}, false},
		{[]resourceapi.ResourceSlice{sl(2, 2, 4), sl(2, 2, 4)}, true},
	} {
		if got := poolComplete(c.slices, NVIDIADriver); got != c.want {
			t.Errorf("%d slices: %v, want %v", len(c.slices), got, c.want)
		}
	}
}

// TestPlanBudget: without a budget every round runs; with one, a round
// starts only where the slowest so far would end within it.
func TestPlanBudget(t *testing.T) {
	if !(Plan{}).another(time.Hour, time.Hour) {
		t.Error("no budget: a round refused")
	}
	p := Plan{Budget: 25 * time.Minute}
	if !p.another(10*time.Minute, 12*time.Minute) {
		t.Error("10 min in, 12 min rounds, 25 min budget: refused")
	}
	if p.another(14*time.Minute, 12*time.Minute) {
		t.Error("14 min in, 12 min rounds, 25 min budget: allowed")
	}
}
