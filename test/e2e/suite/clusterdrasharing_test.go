package suite

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// The DRA phase's sharing (docs/dra.md): a ResourceClaim whose opaque
// configuration is NVIDIA's GpuConfig with sharing strategy MPS, shared
// by two pods on gpu-a, with nri-gpu mps's DaemonSet running the claim
// GPU's MPS control daemon from the DRA driver's checkpoint.

// The claim's mpsConfig, and the limits every client gets from it.
const (
	draMPSThreads = 30
	draMPSMemory  = "8Gi"
	draMPSLimit   = "8192M"
)

// mpsClaim is a ResourceClaim of one nri-gpu GPU with the GpuConfig
// parameters params (JSON).
func mpsClaim(name, params string) string {
	return sharedClaim(name) + fmt.Sprintf(`    config:
    - requests: [gpu]
      opaque:
        driver: %s
        parameters: %s
`, draDriver, params)
}

// mpsClaimPod is a pod on node of the ResourceClaim claim, whose
// container main sleeps, with env (KEY=VALUE).
func mpsClaimPod(name, node, claim string, env ...string) string {
	envBlock := envYAML(env)
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %s}
  resourceClaims:
  - name: gpu
    resourceClaimName: %s
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]%s
    resources: {claims: [{name: gpu}]}
`, name, draNS, node, claim, harness.GlibcImage, envBlock)
}

// testDRASharing: nri-gpu mps's DaemonSet on gpu-a, nri-gpu's DRA
// driver configured as the DRA phase has it. A claim with GpuConfig
// sharing MPS (30 % of the threads, 8Gi) shared by two pods: the claim's
// GPU gets an MPS control daemon with those defaults (the stand-in's
// log), each container gets exactly the claim's CUDA_MPS_* in its
// environment and reaches the daemon through the mounted pipe, and a pod
// spec setting 100 % and the GPU's whole memory gets the same. The claim
// gone, the daemon is retired. A claim whose GpuConfig names an unknown
// strategy (allocated the GPU freed) leaves its pod not running, with the
// kubelet's event naming the field, the bad token and the valid
// strategies.
func testDRASharing(k kc) {
	t := k.t
	start := time.Now()
	a := k.c.Node("gpu-a")
	t.Cleanup(func() {
		if t.Failed() {
			pods, _ := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu-mps")
			for i := range pods {
				out, _ := k.c.Kubectl(k.ctx, "logs", "-n", "nri-gpu", pods[i].Name, "--tail=40")
				t.Logf("--- %s: %s; log ---\n%s", pods[i].Name, harness.PodSummary(&pods[i]), out)
			}
			evs, _ := k.c.Events(k.ctx, draNS, "")
			for _, e := range evs {
				if e.Type != "Normal" {
					t.Logf("event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
				}
			}
		}
		_, _ = k.c.Kubectl(k.ctx, "delete", "pod", "-n", draNS, "mps-1", "mps-2", "mps-bad", "--ignore-not-found", "--wait=true", "--timeout=1m")
		_, _ = k.c.Kubectl(k.ctx, "delete", "resourceclaim", "-n", draNS, "mps", "bad", "--ignore-not-found", "--wait=true", "--timeout=1m")
		_, _ = k.c.Kubectl(k.ctx, "delete", "daemonset", "-n", "nri-gpu", "nri-gpu-mps", "--ignore-not-found", "--wait=true", "--timeout=1m")
		_, _ = k.c.Kubectl(k.ctx, "label", "node", a.Name, "nri-gpu.dev/mps-")
		t.Logf("DRA sharing: %s", time.Since(start).Round(time.Second))
	})
	k.run("label", "node", a.Name, "nri-gpu.dev/mps=true", "--overwrite")
	k.apply(mpsDaemonSet(k))

	params := fmt.Sprintf(`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": %d, "defaultPinnedDeviceMemoryLimit": %q}}}`,
		draMPSThreads, draMPSMemory)
	bad := `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Spatial"}}`
	raise := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=81559M"}
	k.apply(strings.Join([]string{
		mpsClaim("mps", params), mpsClaimPod("mps-1", a.Name, "mps"), mpsClaimPod("mps-2", a.Name, "mps", raise...),
	}, "---\n"))
	v1, v2 := viewClaimPod(k, "mps-1"), viewClaimPod(k, "mps-2")
	if len(v1.assigned) != 1 || !slices.Equal(v1.assigned, v2.assigned) {
		t.Fatalf("the MPS claim: mps-1 sees %v, mps-2 %v; want one GPU, the same", v1.assigned, v2.assigned)
	}
	uuid := v1.assigned[0]
	threads := fmt.Sprintf("%d", draMPSThreads)
	for _, p := range []string{"mps-1", "mps-2"} {
		v, out := viewMPSPodIn(k, draNS, p)
		want := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + threads, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=" + draMPSLimit, "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}
		if !slices.Equal(v.env, want) || v.threads != threads+".0" || v.memory != draMPSLimit || !strings.Contains(v.pipeEntries, "control") {
			t.Errorf("pod %s: CUDA_MPS_* %q (want %q), the daemon's answers %q %q, pipe directory %q:\n%s", p, v.env, want, v.threads, v.memory, v.pipeEntries, out)
		} else {
			t.Logf("pod %s: %v; daemon: %s%% of the threads, %s; /dev/shm %s", p, v.env, v.threads, v.memory, v.shm)
		}
	}
	log := controlLog(a, uuid)
	for _, want := range []string{"CUDA_VISIBLE_DEVICES=" + uuid, "Cmd:set_default_active_thread_percentage " + threads, "Cmd:set_default_device_pinned_mem_limit 0 " + draMPSLimit} {
		if !strings.Contains(log, want) {
			t.Errorf("gpu-a: the claim's MPS control daemon's log lacks %q:\n%s", want, log)
		}
	}

	// The claim gone: no prepared claim needs the daemon; it is retired.
	pid := mpsDaemonPID(uuid)
	if pid == 0 {
		t.Errorf("no MPS control daemon of %s among the host's processes", uuid)
	}
	k.run("delete", "pod", "-n", draNS, "mps-1", "mps-2", "--wait=true", "--timeout=1m")
	k.run("delete", "resourceclaim", "-n", draNS, "mps", "--wait=true", "--timeout=1m")
	k.wait(time.Minute, "the claim's MPS control daemon retired", func() (bool, string, error) {
		now := mpsDaemonPID(uuid)
		return now == 0, fmt.Sprint("pid ", now), nil
	})

	// A bad claim, on the GPU that is free again: its pod does not run;
	// the kubelet says why.
	k.apply(mpsClaim("bad", bad) + "---\n" + mpsClaimPod("mps-bad", a.Name, "bad"))
	k.wait(2*time.Minute, "mps-bad refused naming sharing.strategy", func() (bool, string, error) {
		evs, err := k.c.Events(k.ctx, draNS, "involvedObject.name=mps-bad")
		if err != nil {
			return false, err.Error(), nil
		}
		var msgs []string
		for _, e := range evs {
			msgs = append(msgs, e.Reason+": "+e.Message)
			if strings.Contains(e.Message, `spec.devices.config[0].opaque.parameters.sharing.strategy: "Spatial" is not a sharing strategy (valid: TimeSlicing, MPS)`) {
				t.Logf("mps-bad: %s: %s", e.Reason, e.Message)
				return true, "", nil
			}
		}
		return false, strings.Join(msgs, "; "), nil
	})
	if p, err := k.c.GetPod(k.ctx, draNS, "mps-bad"); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Errorf("mps-bad: %v %v, want not running", err, p)
	}
}
