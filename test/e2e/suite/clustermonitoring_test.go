package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// prometheusOperator is the module whose CRDs (example/prometheus-operator-crd)
// the cluster installs, so that the API server checks the chart's
// ServiceMonitor and PrometheusRule against prometheus-operator's own
// schemas: the newest version of the module the Go module proxy serves.
const prometheusOperator = "github.com/prometheus-operator/prometheus-operator@v0.85.0"

// installMonitoringCRDs installs prometheus-operator's ServiceMonitor,
// PodMonitor and PrometheusRule CRDs (what the chart's switches need on a
// cluster; no operator runs) and waits until the API server serves them.
func installMonitoringCRDs(k kc) {
	k.t.Helper()
	cmd := exec.CommandContext(k.ctx, "go", "mod", "download", "-json", prometheusOperator)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	out, err := cmd.Output()
	if err != nil {
		k.t.Fatalf("go mod download %s: %v", prometheusOperator, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		k.t.Fatalf("go mod download %s: %v %s", prometheusOperator, err, out)
	}
	var names []string
	for _, kind := range []string{"servicemonitors", "podmonitors", "prometheusrules"} {
		f := filepath.Join(mod.Dir, "example", "prometheus-operator-crd", "monitoring.coreos.com_"+kind+".yaml")
		// create, not apply: the CRDs are larger than apply's annotation.
		if _, err := k.c.Kubectl(k.ctx, "create", "-f", f); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
			k.t.Fatal(err)
		}
		names = append(names, "crd/"+kind+".monitoring.coreos.com")
	}
	k.run(append([]string{"wait", "--for=condition=Established", "--timeout=1m"}, names...)...)
}

// checkMonitoring checks what helm-values.yaml's monitoring switches
// installed: the API server took the ServiceMonitor, PrometheusRule,
// NetworkPolicy and the dashboard's ConfigMap; the metrics Service has
// each node's pod as a ready endpoint; each pod's /metrics, read through
// the API server's pod proxy, says nri_gpu_ready 1 and the node's GPUs;
// and its log is JSON lines (logFormat: json).
func checkMonitoring(k kc) {
	t := k.t
	t.Helper()
	for _, obj := range []string{"servicemonitor/nri-gpu", "prometheusrule/nri-gpu", "networkpolicy/nri-gpu", "configmap/nri-gpu-dashboard", "service/nri-gpu-metrics"} {
		if _, err := k.c.Kubectl(k.ctx, "get", "-n", "nri-gpu", obj); err != nil {
			t.Errorf("the chart's %s: %v", obj, err)
		}
	}
	k.wait(time.Minute, "the metrics Service's endpoints are the nodes' pods", func() (bool, string, error) {
		var slices discoveryv1.EndpointSliceList
		if err := k.c.GetJSON(k.ctx, &slices, "endpointslices", "-n", "nri-gpu", "-l", "kubernetes.io/service-name=nri-gpu-metrics"); err != nil {
			return false, err.Error(), nil
		}
		ready := 0
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
		}
		return ready == len(k.c.Nodes), fmt.Sprintf("%d ready endpoints", ready), nil
	})
	for _, n := range k.c.Nodes {
		pod := daemonPod(k, n.Name)
		body := k.run("get", "--raw", "/api/v1/namespaces/nri-gpu/pods/"+pod+":9400/proxy/metrics")
		want := fmt.Sprintf("\nnri_gpu_inventory_gpus %d\n", usableGPUs(n))
		if !strings.Contains(body, "\nnri_gpu_ready 1\n") || !strings.Contains(body, want) {
			t.Errorf("node %s: /metrics of %s lacks nri_gpu_ready 1 or%s", n.Name, pod, want)
		}
		logs := k.run("logs", "-n", "nri-gpu", pod, "--tail=20")
		for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
			var entry map[string]any
			if err := json.Unmarshal([]byte(line), &entry); err != nil || entry["level"] == nil || entry["msg"] == nil {
				t.Errorf("node %s: logFormat json, and nri-gpu logs %q", n.Name, line)
				break
			}
		}
	}
}

// gpuName is a GPU's device name in nri-gpu's ResourceSlices (MIG
// devices have longer names).
var gpuName = regexp.MustCompile(`^gpu-[0-9]+$`)

// testHelmDRA installs the chart with --set config.dra.enabled=true, as
// README and docs/dra.md say: the DRA driver alone (the device plugin off
// in the rendered configuration), the DaemonSet Ready on every node (no
// crash loop), and each node's ResourceSlices offering every GPU; then
// uninstalls it and deletes its slices for the DRA phase.
func testHelmDRA(k kc) {
	t := k.t
	k.helm("install", "nri-gpu", chartDir(), "-n", "nri-gpu", "--create-namespace", "-f", harness.HelmValues(repoRoot()),
		"--set", "config.dra.enabled=true")
	t.Cleanup(func() {
		_, _ = k.c.Helm(context.Background(), "uninstall", "nri-gpu", "-n", "nri-gpu", "--wait", "--timeout=2m")
		_, _ = k.c.Kubectl(context.Background(), "delete", "resourceslices", "--field-selector", "spec.driver="+draDriver, "--wait=true")
	})
	if err := k.c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", int32(len(k.c.Nodes)), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	cfg := k.run("get", "configmap", "-n", "nri-gpu", "nri-gpu-config", "-o", "jsonpath={.data.config\\.yaml}")
	if !regexp.MustCompile(`(?m)^devicePlugin:\n(  .*\n)*  enabled: false\n`).MatchString(cfg) {
		t.Errorf("config.dra.enabled=true: the device plugin is not off in\n%s", cfg)
	}
	k.wait(time.Minute, "each node's ResourceSlices offer its GPUs", func() (bool, string, error) {
		var list resourceapi.ResourceSliceList
		if err := k.c.GetJSON(k.ctx, &list, "resourceslices"); err != nil {
			return false, err.Error(), nil
		}
		var problems []string
		for _, n := range k.c.Nodes {
			got := 0
			for _, s := range list.Items {
				if s.Spec.Driver == draDriver && s.Spec.NodeName != nil && *s.Spec.NodeName == n.Name {
					for _, d := range s.Spec.Devices {
						if gpuName.MatchString(d.Name) {
							got++
						}
					}
				}
			}
			if got != usableGPUs(n) {
				problems = append(problems, fmt.Sprintf("node %s: %d GPUs, want %d", n.Name, got, usableGPUs(n)))
			}
		}
		return len(problems) == 0, strings.Join(problems, "; "), nil
	})
}
