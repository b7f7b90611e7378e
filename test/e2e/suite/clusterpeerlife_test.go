package suite

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// lifeNS is the namespace of the prepare and restart checks.
const lifeNS = "life"

// lifePod is a pod on node with a claim (of its own template) of one
// device of class that sel selects (peerSelector).
func lifePod(name, node, class, sel string) string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %[1]s, namespace: %[4]s}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: %[3]s
          selectors:
          - cel: {expression: %[6]q}
---
apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[4]s}
spec:
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: %[1]s}
  containers:
  - name: main
    image: %[5]s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: gpu}]}
`, name, node, class, lifeNS, harness.GlibcImage, sel)
}

// podOutcome waits up to timeout for pod name in ns to run and returns
// "Running" (its container still up, not restarted, 5 s later), or the
// last warning the kubelet gave for it (what ended its container, when it
// ran and ended).
func podOutcome(k kc, ns, name string, timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	last := "Pending"
	for time.Now().Before(deadline) {
		p, err := k.c.GetPod(k.ctx, ns, name)
		if err == nil && p.Status.Phase == corev1.PodRunning {
			time.Sleep(5 * time.Second)
			if p, err = k.c.GetPod(k.ctx, ns, name); err == nil && len(p.Status.ContainerStatuses) == 1 {
				cs := p.Status.ContainerStatuses[0]
				if cs.RestartCount == 0 && cs.State.Running != nil {
					return "Running"
				}
				if term := cs.LastTerminationState.Terminated; term != nil {
					return fmt.Sprintf("Running, then its container ended (%s, exit %d): %s", term.Reason, term.ExitCode, shorten(term.Message))
				}
				if w := cs.State.Waiting; w != nil {
					return fmt.Sprintf("Running, then %s: %s", w.Reason, shorten(w.Message))
				}
			}
		}
		if err == nil {
			for _, cs := range p.Status.ContainerStatuses {
				if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
					last = w.Reason + ": " + w.Message
				}
			}
		}
		if evs, err := k.c.Events(k.ctx, ns, "involvedObject.name="+name); err == nil {
			for _, e := range evs {
				if e.Type == corev1.EventTypeWarning {
					last = e.Reason + ": " + e.Message
				}
			}
		}
		time.Sleep(time.Second)
	}
	return last
}

// containerID is the ID of pod name's container main, "" when none.
func containerID(k kc, ns, name string) string {
	p, err := k.c.GetPod(k.ctx, ns, name)
	if err != nil || len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	return p.Status.ContainerStatuses[0].ContainerID
}

// cdiSpecSummary lists the CDI specs in node n's CDI directory: for each,
// its file, size, and how many device nodes, mounts, hooks and
// environment entries its devices and common edits hold.
func cdiSpecSummary(n *harness.Node) []string {
	dir := n.HostPath(harness.NodeCDIDir)
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var spec struct {
			Kind           string `json:"kind"`
			ContainerEdits edits  `json:"containerEdits"`
			Devices        []struct {
				Name           string `json:"name"`
				ContainerEdits edits  `json:"containerEdits"`
			} `json:"devices"`
		}
		if err := yaml.Unmarshal(data, &spec); err != nil {
			out = append(out, fmt.Sprintf("%s (%d bytes): %v", e.Name(), len(data), err))
			continue
		}
		var devs []string
		for _, d := range spec.Devices {
			devs = append(devs, d.Name+" "+d.ContainerEdits.String())
		}
		out = append(out, fmt.Sprintf("%s (%d bytes, kind %s): common %s; devices %s", e.Name(), len(data), spec.Kind, spec.ContainerEdits, strings.Join(devs, ", ")))
	}
	sort.Strings(out)
	return out
}

// edits are a CDI spec's container edits, counted.
type edits struct {
	Env         []string          `json:"env"`
	DeviceNodes []json.RawMessage `json:"deviceNodes"`
	Mounts      []json.RawMessage `json:"mounts"`
	Hooks       []struct {
		Args []string `json:"args"`
	} `json:"hooks"`
}

func (e edits) String() string {
	var hooks []string
	for _, h := range e.Hooks {
		if len(h.Args) > 1 {
			hooks = append(hooks, h.Args[1])
		}
	}
	return fmt.Sprintf("{%d device nodes, %d mounts, hooks %v, env %v}", len(e.DeviceNodes), len(e.Mounts), hooks, e.Env)
}

// testPeerLifecycle sets the two drivers side by side on peer-h100 (its
// GPUs 2 and 3, whole): the CDI specs each leaves for a prepared claim; a
// restart of each with a claim prepared (the container stays, the claim
// is unprepared when its pod goes, a new claim is prepared); the node's
// driver upgraded under a prepared claim, then a new claim; the driver
// started before the node's /dev/nvidia* exist, then a claim once they
// do. restart is NVIDIA's driver's restart on peer-h100.
func testPeerLifecycle(k kc, restart func() *nvidiaDRA) {
	t := k.t
	n := k.c.Node("peer-h100")
	k.run("create", "namespace", lifeNS)
	defer k.run("delete", "namespace", lifeNS, "--wait=true", "--timeout=3m")
	classes := []struct{ driver, class, suffix string }{{nvidiaDriver, "gpu.nvidia.com", "nv"}, {draDriver, "gpu.nri-gpu.dev", "ng"}}
	run := func(step string) map[string]string {
		out := map[string]string{}
		for _, c := range classes {
			name := step + "-" + c.suffix
			k.apply(lifePod(name, n.Name, c.class, peerSelector(k.c, c.driver)))
		}
		for _, c := range classes {
			name := step + "-" + c.suffix
			out[c.driver] = podOutcome(k, lifeNS, name, 90*time.Second)
		}
		return out
	}
	del := func(names ...string) {
		k.run(append([]string{"delete", "pod", "-n", lifeNS, "--ignore-not-found", "--wait=true", "--timeout=2m"}, names...)...)
	}

	// The specs of one prepared claim each.
	if got := run("a"); got[nvidiaDriver] != "Running" || got[draDriver] != "Running" {
		t.Fatalf("a claim of each driver: %v", got)
	}
	for _, s := range cdiSpecSummary(n) {
		t.Logf("CDI spec on %s: %s", n.Name, s)
	}

	// A restart of each driver with its claim prepared.
	ids := map[string]string{"a-nv": containerID(k, lifeNS, "a-nv"), "a-ng": containerID(k, lifeNS, "a-ng")}
	nv := restart()
	waitNVIDIASlice(k, nv, peerDevices[n.Name])
	k.doc("restart", nil)
	if err := k.c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", int32(len(k.c.Nodes)), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	for name, id := range ids {
		if now := containerID(k, lifeNS, name); now != id {
			t.Errorf("pod %s: container %s became %s over the drivers' restarts", name, id, now)
		}
	}
	specsBefore := len(cdiSpecSummary(n))
	del("a-nv", "a-ng")
	k.wait(time.Minute, "the claims' CDI specs removed (unprepared after the restarts)", func() (bool, string, error) {
		left := cdiSpecSummary(n)
		return len(left) <= specsBefore-2, strings.Join(left, "; "), nil
	})
	if got := run("b"); got[nvidiaDriver] != "Running" || got[draDriver] != "Running" {
		t.Errorf("a new claim of each driver after the restarts: %v", got)
	}

	// The node's driver upgraded under prepared claims (b-nv, b-ng), then
	// a claim of each driver; the claims' pods deleted; NVIDIA's driver
	// restarted.
	old := n.GPU.DriverVersion
	up, err := simnode.Upgrade(n.GPU, draUpgradeVersion, simnode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n.GPU = up
	waitDriverVersion(k, n.Name, draUpgradeVersion)
	got := run("c")
	for _, c := range classes {
		name := "c-" + c.suffix
		nvml := ""
		if got[c.driver] == "Running" {
			nvml, _ = k.c.Exec(k.ctx, lifeNS, name, "main", "gpucheck", "nvml")
		}
		t.Logf("%s: after the driver's upgrade to %s under a prepared claim, a new claim: %s; NVML in it: %s", c.driver, draUpgradeVersion, got[c.driver], strings.TrimSpace(nvml))
	}
	for _, p := range []string{"b-nv", "b-ng"} {
		if st := podOutcome(k, lifeNS, p, time.Second); st != "Running" {
			t.Errorf("pod %s (prepared before the upgrade): %s", p, st)
		}
	}
	if got[draDriver] != "Running" {
		t.Errorf("nri-gpu after the upgrade: %s", got[draDriver])
	}
	gone := deleteAndWait(k, 45*time.Second, "b-nv", "b-ng", "c-nv", "c-ng")
	for _, p := range []string{"b-nv", "b-ng", "c-nv", "c-ng"} {
		t.Logf("pod %s deleted after the upgrade: %s", p, gone[p])
	}
	if gone["b-ng"] != "gone" || gone["c-ng"] != "gone" {
		t.Errorf("nri-gpu's claims after the upgrade: %v", gone)
	}
	nv = restart()
	waitNVIDIASlice(k, nv, peerDevices[n.Name])
	gone = deleteAndWait(k, 90*time.Second, "b-nv", "c-nv")
	t.Logf("NVIDIA's driver restarted: its claims' pods %v", gone)
	k.apply(lifePod("d-nv", n.Name, "gpu.nvidia.com", peerSelector(k.c, nvidiaDriver)))
	st := podOutcome(k, lifeNS, "d-nv", 90*time.Second)
	nvml := ""
	if st == "Running" {
		nvml, _ = k.c.Exec(k.ctx, lifeNS, "d-nv", "main", "gpucheck", "nvml")
	}
	t.Logf("NVIDIA's driver restarted after the upgrade, a new claim: %s; NVML in it: %s", st, strings.TrimSpace(nvml))
	back, err := simnode.Upgrade(up, old, simnode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n.GPU = back
	waitDriverVersion(k, n.Name, old)
	nv = restart() // it resolved libnvidia-ml.so.1 to the upgrade's file
	waitNVIDIASlice(k, nv, peerDevices[n.Name])
	deleteAndWait(k, 90*time.Second, "d-nv")

	// The drivers started while the node's /dev/nvidia* do not exist yet
	// (a driver container still loading the kernel module), then a claim
	// once they do.
	devDir := n.GPU.HostPath("/dev")
	hidden := n.GPU.HostPath("/dev-hidden")
	if err := os.MkdirAll(hidden, 0o755); err != nil {
		t.Fatal(err)
	}
	nodes, _ := filepath.Glob(filepath.Join(devDir, "nvidia*"))
	hide := func(from, to string) {
		for _, p := range nodes {
			rel, _ := filepath.Rel(devDir, p)
			if err := os.Rename(filepath.Join(from, rel), filepath.Join(to, rel)); err != nil {
				t.Fatal(err)
			}
		}
	}
	hide(devDir, hidden)
	nv = restart()
	k.doc("restart", nil)
	err = k.c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", int32(len(k.c.Nodes)), 2*time.Minute)
	t.Logf("nri-gpu restarted without /dev/nvidia*: ready: %v", err)
	t.Logf("NVIDIA's driver started without /dev/nvidia*: exited %v", nv.exited())
	hide(hidden, devDir)
	if nv.exited() {
		restart()
	}
	if err := k.c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", int32(len(k.c.Nodes)), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	got = run("e")
	for _, c := range classes {
		name := "e-" + c.suffix
		view := ""
		if got[c.driver] == "Running" {
			view, _ = k.c.Exec(k.ctx, lifeNS, name, "main", "sh", "-c", "ls /dev | grep nvidia | tr '\\n' ' '; gpucheck cuda")
		}
		t.Logf("%s started before /dev/nvidia* existed, a claim once they did: %s; the container: %s", c.driver, got[c.driver], strings.TrimSpace(view))
	}
	if got[draDriver] != "Running" {
		t.Errorf("nri-gpu restarted before /dev/nvidia* existed, a claim once they did: %s", got[draDriver])
	}
	for _, s := range cdiSpecSummary(n) {
		t.Logf("CDI spec on %s: %s", n.Name, s)
	}
	del("e-nv", "e-ng")
	nv = restart()
	waitNVIDIASlice(k, nv, peerDevices[n.Name])
	k.apply(lifePod("f-nv", n.Name, "gpu.nvidia.com", peerSelector(k.c, nvidiaDriver)))
	t.Logf("NVIDIA's driver restarted once /dev/nvidia* existed, a claim: %s", podOutcome(k, lifeNS, "f-nv", 90*time.Second))
	del("f-nv")
}

// deleteAndWait deletes the pods names in lifeNS without waiting, then
// waits up to timeout for each to be gone (its claim unprepared) and
// returns, by pod, "gone" or the last warning of its unprepare.
func deleteAndWait(k kc, timeout time.Duration, names ...string) map[string]string {
	k.run(append([]string{"delete", "pod", "-n", lifeNS, "--ignore-not-found", "--wait=false"}, names...)...)
	out := map[string]string{}
	deadline := time.Now().Add(timeout)
	for _, name := range names {
		for {
			if _, err := k.c.GetPod(k.ctx, lifeNS, name); err != nil && strings.Contains(err.Error(), "NotFound") {
				out[name] = "gone"
				break
			}
			if time.Now().After(deadline) {
				out[name] = "still there"
				if evs, err := k.c.Events(k.ctx, lifeNS, "involvedObject.name="+name); err == nil {
					for _, e := range evs {
						if e.Type == corev1.EventTypeWarning {
							out[name] = "still there: " + e.Reason + ": " + shorten(e.Message)
						}
					}
				}
				break
			}
			time.Sleep(time.Second)
		}
	}
	return out
}
