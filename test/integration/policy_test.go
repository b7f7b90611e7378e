package integration

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestPolicyOverNRI runs the plugin with a secure policy: the pods of the
// test runtime live in namespace "default", which may use neither
// annotations nor NVIDIA_VISIBLE_DEVICES; the device plugin's mount list
// still works.
func TestPolicyOverNRI(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	_, cfg := simNode(t, dir, simnode.LayoutDebian)
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("policy:\n  annotationNamespaces: [ml]\n  cdiNamespaces: [ml]\n  managementNamespaces: [gpu-operator]\n  visibleDevices: deny\n")
	f.Close()
	r := startRuntime(t, dir)
	defer r.stop()
	p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket)
	select {
	case <-r.synced:
	case <-time.After(20 * time.Second):
		t.Fatal("the plugin did not connect")
	}
	// The probe of waitSynced uses an annotation, which this policy
	// refuses in "default": wait for the refusal instead.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := r.create(map[string]string{"gpus.nri-gpu.dev/pod": "1"}, "probe")
		if err != nil && strings.Contains(err.Error(), `nri-gpu: annotation gpus.nri-gpu.dev/pod: not allowed in namespace "default" (policy.annotationNamespaces: [ml])`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("annotation not refused: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	adj, err := r.create(nil, "cuda", "NVIDIA_VISIBLE_DEVICES=all")
	if err != nil {
		t.Fatal(err)
	}
	spec := applyToSpec(t, adj)
	if len(spec.Linux.Devices) != 0 || !strings.Contains(strings.Join(spec.Process.Env, "\n"), "NVIDIA_VISIBLE_DEVICES=void") {
		t.Errorf("env request under deny: devices %v, env %v", spec.Linux.Devices, spec.Process.Env)
	}
	if !strings.Contains(p.log.String(), "env NVIDIA_VISIBLE_DEVICES ignored") {
		t.Errorf("no log line for the ignored variable:\n%s", p.log.String())
	}

	if _, err := r.create(map[string]string{"nvidia.cdi.k8s.io/pod": "management.nvidia.com/gpu=all"}, "dcgm"); err == nil ||
		!strings.Contains(err.Error(), "policy.managementNamespaces: [gpu-operator]") {
		t.Errorf("management outside its namespace: %v", err)
	}
}
