package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// CaptureNode is the Node NVIDIA's driver runs as while the bench
// captures its slices: not one of the bench's nodes, unschedulable, no
// kwok annotation, deleted after the capture.
const CaptureNode = "nvidia-capture"

// nvidiaCaptureScript runs NVIDIA's driver ("$@") in a mount namespace of
// its own where the simulated node's /proc/driver and /proc/devices lie
// over the host's: it reads them at those absolute paths (the MIG
// capability files, the nvidia-caps major), as a real node's kernel
// module provides them.
const nvidiaCaptureScript = `root=$1; shift
mount --bind "$root/proc/driver" /proc/driver
mount --bind "$root/proc/devices" /proc/devices
exec "$@"`

// nvidiaPluginArgs are gpu-kubelet-plugin's flags to publish variant v
// of the simulated node at root as node, with the cluster's kubeconfig
// and its own kubelet plugin, registration and CDI directories under
// work. Shares turns on its alpha ConsumableShares gate with
// --consumable-shares=memory; MIG is its static path (DynamicMIG off, its
// default), the node's MIG devices made before it starts. hook is only
// written into CDI specs (prepares, which the capture does none of); a
// path must be given, else it copies /usr/bin/nvidia-cdi-hook.
func nvidiaPluginArgs(v Variant, node, kubeconfig, root, work, hook string) []string {
	args := []string{
		"--node-name", node,
		"--namespace", "nvidia-dra-driver-gpu",
		"--image-name", "nvcr.io/nvidia/k8s-dra-driver-gpu:" + harness.NVIDIADRAVersion,
		"--kubeconfig", kubeconfig,
		"--nvidia-driver-root", root,
		"--container-driver-root", root,
		"--cdi-root", filepath.Join(work, "cdi"),
		"--nvidia-cdi-hook-path", hook,
		"--kubelet-registrar-directory-path", filepath.Join(work, "plugins_registry"),
		"--kubelet-plugins-directory-path", filepath.Join(work, "plugins"),
		"--healthcheck-port", "-1",
		"-v", "4",
	}
	if v == Shares {
		args = append(args, "--feature-gates", "ConsumableShares=true", "--consumable-shares", "memory")
	}
	return args
}

// CaptureNVIDIA runs NVIDIA's real kubelet plugin (bin) once per variant
// on the inventory's simulated node of that variant, against the
// cluster's API server as node CaptureNode, reads the ResourceSlices it
// publishes, stops it and deletes them; the slices are written to
// dir/<variant>.json (what Captured reads) beside its log. It needs no
// kubelet: the plugin's helper library publishes through the API server
// on its own (only prepares come through the kubelet's registration).
func (c *Cluster) CaptureNVIDIA(ctx context.Context, inv *Inventory, bin, hook, dir string) (map[Variant][]resourceapi.Device, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: CaptureNode}, Spec: corev1.NodeSpec{Unschedulable: true,
		Taints: []corev1.Taint{{Key: "nri-gpu.dev/nvidia-capture", Effect: corev1.TaintEffectNoSchedule}}}}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("capture node: %w", err)
	}
	defer func() {
		_ = c.Client.CoreV1().Nodes().Delete(context.WithoutCancel(ctx), CaptureNode, metav1.DeleteOptions{})
	}()
	out := map[Variant][]resourceapi.Device{}
	for _, v := range Variants {
		start := time.Now()
		devs, err := c.captureOne(ctx, v, inv.roots[v], bin, hook, filepath.Join(dir, string(v)))
		if err != nil {
			return out, fmt.Errorf("NVIDIA's driver, %s: %w", v, err)
		}
		out[v] = devs
		c.Logf("NVIDIA's driver published %d %s devices in %s", len(devs), v, time.Since(start).Round(100*time.Millisecond))
	}
	return out, nil
}

// captureOne is CaptureNVIDIA's run of the plugin for one variant.
func (c *Cluster) captureOne(ctx context.Context, v Variant, root, bin, hook, work string) ([]resourceapi.Device, error) {
	// Its directories must be there: it binds its sockets in them.
	for _, d := range []string{"cdi", "plugins_registry", "plugins"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			return nil, err
		}
	}
	logPath := filepath.Join(work, "gpu-kubelet-plugin.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	argv := c.Net.NS.Wrap(append([]string{"unshare", "--mount", "--propagation", "private", "--", "bash", "-ec",
		nvidiaCaptureScript, "nvidia-capture", root, bin}, nvidiaPluginArgs(v, CaptureNode, c.Kubeconfig, root, work, hook)...))
	cmd := exec.Command(argv[0], argv[1:]...)
	// Its documented knob for another sysfs: the simulated node's (the
	// PCIe root and NUMA node of each GPU).
	cmd.Env = append(os.Environ(), "NVIDIA_DRA_SYSFS_ROOT="+filepath.Join(root, "sys"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	sel := metav1.ListOptions{FieldSelector: "spec.nodeName=" + CaptureNode}
	var list *resourceapi.ResourceSliceList
	err = harness.WaitFor(ctx, 2*time.Minute, "NVIDIA's driver's ResourceSlices of "+CaptureNode, func() (bool, string, error) {
		select {
		case <-done:
			return false, "", fmt.Errorf("it exited: %s", tail(logPath, 3000))
		default:
		}
		l, err := c.Client.ResourceV1().ResourceSlices().List(ctx, sel)
		if err != nil {
			return false, err.Error(), nil
		}
		list = l
		return poolComplete(l.Items, NVIDIADriver), fmt.Sprintf("%d slices", len(l.Items)), nil
	})
	stop()
	if err != nil {
		return nil, fmt.Errorf("%w\n--- tail of its log ---\n%s", err, tail(logPath, 3000))
	}
	list.Kind, list.APIVersion = "ResourceSliceList", "resource.k8s.io/v1"
	if data, err := json.MarshalIndent(list, "", "  "); err == nil {
		err = os.WriteFile(filepath.Join(filepath.Dir(work), string(v)+".json"), data, 0o644)
		if err != nil {
			return nil, err
		}
	}
	if err := c.Client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		return nil, err
	}
	if err := c.waitCount(ctx, "capture slices deleted", 0, func(ctx context.Context) (int, error) {
		l, err := c.Client.ResourceV1().ResourceSlices().List(ctx, sel)
		if err != nil {
			return 0, err
		}
		return len(l.Items), nil
	}); err != nil {
		return nil, err
	}
	data, err := json.Marshal(list)
	if err != nil {
		return nil, err
	}
	return capturedDevices(data, NVIDIADriver)
}

// poolComplete reports whether slices hold driver's pool whole: every
// slice of its latest generation (ResourceSliceCount of them), with
// devices.
func poolComplete(slices []resourceapi.ResourceSlice, driver string) bool {
	gen, want, have, devs := int64(-1), int64(0), int64(0), 0
	for _, s := range slices {
		if s.Spec.Driver == driver && s.Spec.Pool.Generation > gen {
			gen, want = s.Spec.Pool.Generation, s.Spec.Pool.ResourceSliceCount
		}
	}
	for _, s := range slices {
		if s.Spec.Driver == driver && s.Spec.Pool.Generation == gen {
			have++
			devs += len(s.Spec.Devices)
		}
	}
	return gen >= 0 && have == want && devs > 0
}

// tail is the last n bytes of the file at path.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(data)
}

// CompareDevices says how captured (NVIDIA's real driver's devices of a
// node) differs from source (the shape nvidia.go reads from its source,
// of the same node): the device counts, the names in one only, and, over
// the devices both have, each attribute or capacity that is in one only
// or differs, with how many devices and one example. None: the same.
func CompareDevices(source, captured []resourceapi.Device) []string {
	var out []string
	if len(source) != len(captured) {
		out = append(out, fmt.Sprintf("%d devices from the source, %d captured", len(source), len(captured)))
	}
	src, capd := map[string]resourceapi.Device{}, map[string]resourceapi.Device{}
	for _, d := range source {
		src[d.Name] = d
	}
	for _, d := range captured {
		capd[d.Name] = d
	}
	var onlySrc, onlyCap []string
	for n := range src {
		if _, ok := capd[n]; !ok {
			onlySrc = append(onlySrc, n)
		}
	}
	for n := range capd {
		if _, ok := src[n]; !ok {
			onlyCap = append(onlyCap, n)
		}
	}
	sort.Strings(onlySrc)
	sort.Strings(onlyCap)
	if len(onlySrc) > 0 {
		out = append(out, "devices only from the source: "+strings.Join(onlySrc, " "))
	}
	if len(onlyCap) > 0 {
		out = append(out, "devices only captured: "+strings.Join(onlyCap, " "))
	}
	type seen struct {
		n       int
		example string
	}
	diffs := map[string]*seen{}
	note := func(what, device, example string) {
		if diffs[what] == nil {
			diffs[what] = &seen{example: device + ": " + example}
		}
		diffs[what].n++
	}
	for name, s := range src {
		c, ok := capd[name]
		if !ok {
			continue
		}
		for k, d := range fieldsOf(s) {
			if e, ok := fieldsOf(c)[k]; !ok {
				note(k+" only from the source", name, d)
			} else if e != d {
				note(k+" differs", name, "source "+d+", captured "+e)
			}
		}
		for k, e := range fieldsOf(c) {
			if _, ok := fieldsOf(s)[k]; !ok {
				note(k+" only captured", name, e)
			}
		}
	}
	keys := make([]string, 0, len(diffs))
	for k := range diffs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s on %d devices (e.g. %s)", k, diffs[k].n, diffs[k].example))
	}
	return out
}

// fieldsOf is d's attributes, capacities and multiple-allocation flag,
// each as a name ("attribute X", "capacity Y") and its JSON.
func fieldsOf(d resourceapi.Device) map[string]string {
	out := map[string]string{}
	js := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			return err.Error()
		}
		return string(b)
	}
	for n, a := range d.Attributes {
		out["attribute "+string(n)] = js(a)
	}
	for n, c := range d.Capacity {
		out["capacity "+string(n)] = js(c)
	}
	if d.AllowMultipleAllocations != nil {
		out["allowMultipleAllocations"] = js(*d.AllowMultipleAllocations)
	}
	for _, f := range []struct {
		name string
		v    any
		set  bool
	}{{"consumesCounters", d.ConsumesCounters, len(d.ConsumesCounters) > 0}, {"taints", d.Taints, len(d.Taints) > 0},
		{"nodeName", d.NodeName, d.NodeName != nil}, {"bindsToNode", d.BindsToNode, d.BindsToNode != nil}} {
		if f.set {
			out[f.name] = js(f.v)
		}
	}
	return out
}

// errNoCapture is returned where a capture is asked of a shape that is
// not NVIDIA's.
var errNoCapture = errors.New("only NVIDIA's shape is captured")

// CaptureInto captures NVIDIA's real driver's slices (CaptureNVIDIA) and
// makes them nv's devices (UseCaptured); the comparison with the
// source-read shape (CompareDevices) is returned by variant, and also
// written to dir/compare.txt.
func (c *Cluster) CaptureInto(ctx context.Context, nv *Shape, inv *Inventory, bin, hook, dir string) (map[Variant][]string, error) {
	if nv.Driver != NVIDIADriver {
		return nil, errNoCapture
	}
	got, err := c.CaptureNVIDIA(ctx, inv, bin, hook, dir)
	if err != nil {
		return nil, err
	}
	diffs := map[Variant][]string{}
	var sb strings.Builder
	for _, v := range Variants {
		diffs[v] = CompareDevices(nv.devices[v], got[v])
		fmt.Fprintf(&sb, "%s: %d devices captured, %d read from the source\n", v, len(got[v]), len(nv.devices[v]))
		for _, d := range diffs[v] {
			fmt.Fprintf(&sb, "  %s\n", d)
		}
	}
	UseCaptured(nv, got, fmt.Sprintf("gpu-kubelet-plugin %s run on the simulated node in the same run", harness.NVIDIADRAVersion))
	return diffs, os.WriteFile(filepath.Join(dir, "compare.txt"), []byte(sb.String()), 0o644)
}
