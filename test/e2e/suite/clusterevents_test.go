package suite

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// eventsNS may ask by annotation in the test overlay's configuration
// (test/e2e/cluster/kustomize/config.yaml); eventsClosedNS is closed, as
// every namespace is under the shipped policy.
const (
	eventsNS       = "gpu-events"
	eventsClosedNS = "gpu-events-closed"
)

// wantEvent is an Event nri-gpu must write on a pod.
type wantEvent struct {
	ns, pod, reason string
	// in are what its message must say: the carrier, the bad token or
	// the policy key.
	in []string
}

// testEvents checks the pods' Events on the kustomize install: a pod
// whose NVIDIA_VISIBLE_DEVICES=0 the closed policy voids runs without
// GPUs and gets a GPURequestVoided Event naming the variable and the
// policy key; a pod asking for more GPUs than a node has, and one naming a
// GPU that does not exist, are not created and get GPURequestRefused
// Events with the request path's message; kubectl describe pod shows
// them, from nri-gpu on the pod's node.
func testEvents(k kc) {
	t := k.t
	start := time.Now()
	for _, ns := range []string{eventsNS, eventsClosedNS} {
		k.run("create", "namespace", ns)
		defer k.run("delete", "namespace", ns, "--wait=false")
	}
	pod := func(name, ns, ann, env string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  annotations: {%s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    env: [%s]
`, name, ns, ann, harness.GlibcImage, env)
	}
	k.apply(pod("voided", eventsClosedNS, "", `{name: NVIDIA_VISIBLE_DEVICES, value: "0"}`) + "---\n" +
		pod("over-request", eventsNS, `gpus.nri-gpu.dev/pod: "9"`, "") + "---\n" +
		pod("bad-annotation", eventsNS, `gpus.nri-gpu.dev/container.main: "device=bogus"`, ""))
	for _, w := range []wantEvent{
		{eventsClosedNS, "voided", "GPURequestVoided", []string{"container main: env NVIDIA_VISIBLE_DEVICES ignored", `not allowed in namespace "` + eventsClosedNS + `"`, "policy.visibleDevices: deny", "it runs without GPUs"}},
		{eventsNS, "over-request", "GPURequestRefused", []string{"container main: annotation gpus.nri-gpu.dev/pod: count 9 exceeds the node's"}},
		{eventsNS, "bad-annotation", "GPURequestRefused", []string{`container main: annotation gpus.nri-gpu.dev/container.main: unknown device "bogus" (valid:`}},
	} {
		checkEvent(k, w)
	}
	// The Event is sent at CreateContainer, before the container starts.
	if _, err := k.c.WaitPodRunning(k.ctx, eventsClosedNS, "voided", time.Minute); err != nil {
		t.Errorf("the voided pod does not run: %v", err)
	}
	out := k.run("describe", "pod", "-n", eventsNS, "over-request")
	if !strings.Contains(out, "GPURequestRefused") || !strings.Contains(out, "count 9 exceeds the node's") || !strings.Contains(out, "nri-gpu") {
		t.Errorf("kubectl describe pod does not show nri-gpu's Event:\n%s", out)
	}
	t.Logf("the pods' Events: %s", time.Since(start).Round(time.Second))
}

// checkEvent waits for w's Event on its pod and checks its source: nri-gpu
// on the pod's node, the container named in its annotations.
func checkEvent(k kc, w wantEvent) {
	k.t.Helper()
	var got corev1.Event
	k.wait(2*time.Minute, w.ns+"/"+w.pod+": Event "+w.reason, func() (bool, string, error) {
		evs, err := k.c.Events(k.ctx, w.ns, "involvedObject.name="+w.pod)
		if err != nil {
			return false, err.Error(), nil
		}
		var seen []string
		for _, e := range evs {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == w.reason && e.Source.Component == "nri-gpu" {
				got = e
				return true, "", nil
			}
		}
		return false, strings.Join(seen, "; "), nil
	})
	for _, s := range w.in {
		if !strings.Contains(got.Message, s) {
			k.t.Errorf("%s/%s: Event %q lacks %q", w.ns, w.pod, got.Message, s)
		}
	}
	p, err := k.c.GetPod(k.ctx, w.ns, w.pod)
	if err != nil {
		k.t.Fatal(err)
	}
	if got.Type != corev1.EventTypeWarning || got.InvolvedObject.Kind != "Pod" || got.InvolvedObject.UID != p.UID ||
		got.Source.Host != p.Spec.NodeName || got.Annotations["nri-gpu.dev/container"] != "main" {
		k.t.Errorf("%s/%s: Event %+v, want a Warning on the pod (UID %s) from nri-gpu on %s, container main", w.ns, w.pod, got, p.UID, p.Spec.NodeName)
	}
}
