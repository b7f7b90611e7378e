package deploy

import (
	"os"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
)

// namespacesTried are namespaces a tenant, the cluster or an operator may
// use; the shipped Kubernetes policy opens no request source in any.
var namespacesTried = []string{"default", "tenant-a", "kube-system", "gpu-operator", "nri-gpu", "monitoring"}

// sources are the policy's request sources.
var sources = []policy.Source{policy.Annotation, policy.CDI, policy.Management, policy.DeviceList, policy.Env, policy.IMEX}

// parseShipped parses the configuration file a ConfigMap carries.
func parseShipped(t *testing.T, objs objects) config.Config {
	t.Helper()
	text, ok := objs.configMap.Data["config.yaml"]
	if !ok {
		t.Fatal("the ConfigMap has no config.yaml")
	}
	c, err := config.Parse([]byte(text))
	if err != nil {
		t.Fatalf("config.Parse: %v", err)
	}
	return c
}

// checkClosed checks that p allows no source in any of namespacesTried:
// the device plugin's list is a request everywhere, but never names GPUs
// on its own (only with the GPUs' device nodes).
func checkClosed(t *testing.T, what string, p policy.Policy) {
	t.Helper()
	for _, ns := range namespacesTried {
		for _, s := range sources {
			if got, want := p.Allows(s, ns), s == policy.DeviceList; got != want {
				t.Errorf("%s: Allows(%v, %q) = %v, want %v", what, s, ns, got, want)
			}
		}
		if p.TrustsDeviceList(ns) {
			t.Errorf("%s: the device-list mounts alone name GPUs in %q", what, ns)
		}
	}
}

// TestShippedPolicies: the Kubernetes ConfigMap and the chart's default
// values parse and close every request source in every namespace; the
// chart's policy values open exactly the namespaces listed; the
// single-node configurations keep the toolkit's behaviour.
func TestShippedPolicies(t *testing.T) {
	plain, _ := loadKubernetes(t)
	checkClosed(t, "deploy/kubernetes", parseShipped(t, plain).Policy)
	chart, _ := renderHelm(t, nil)
	checkClosed(t, "chart defaults", parseShipped(t, chart).Policy)

	opened, _ := renderHelm(t, func(v map[string]any) {
		p := v["config"].(map[string]any)["policy"].(map[string]any)
		p["managementNamespaces"] = []any{"gpu-operator"}
		p["deviceListNamespaces"] = []any{"ml"}
		p["visibleDevices"] = "namespaces"
		p["envNamespaces"] = []any{"legacy"}
		p["imexNamespaces"] = []any{"nvl72"}
	})
	p := parseShipped(t, opened).Policy
	for _, tc := range []struct {
		s    policy.Source
		ns   string
		want bool
	}{
		{policy.Management, "gpu-operator", true},
		{policy.Management, "ml", false},
		{policy.Env, "legacy", true},
		{policy.Env, "default", false},
		{policy.Annotation, "gpu-operator", false},
		{policy.CDI, "ml", false},
		{policy.IMEX, "nvl72", true},
		{policy.IMEX, "ml", false},
	} {
		if got := p.Allows(tc.s, tc.ns); got != tc.want {
			t.Errorf("chart with namespaces listed: Allows(%v, %q) = %v, want %v", tc.s, tc.ns, got, tc.want)
		}
	}
	if !p.TrustsDeviceList("ml") || p.TrustsDeviceList("default") {
		t.Errorf("chart with deviceListNamespaces: [ml]: trusts ml %v, default %v", p.TrustsDeviceList("ml"), p.TrustsDeviceList("default"))
	}

	// Single-node installs: the image author is the operator; env stays
	// on, as the comments in these files say.
	for _, f := range []string{"systemd/config.yaml", "nri/10-nri-gpu.conf"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c, err := config.Parse(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, s := range sources {
			if !c.Policy.Allows(s, "default") {
				t.Errorf("%s: %v not allowed; the single-node default is the toolkit's", f, s)
			}
		}
	}
}
