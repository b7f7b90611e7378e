package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// draDirs are the host directories the DRA driver writes, mounted at the
// same paths.
var draDirs = []string{"/var/lib/kubelet/plugins/gpu.nri-gpu.dev", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"}

// withDRA renders the chart with config.dra.enabled and the device plugin
// off (one allocator), and nvidiaGPUResource res.
func withDRA(t *testing.T, res string) objects {
	t.Helper()
	objs, _ := renderHelm(t, func(v map[string]any) {
		c := v["config"].(map[string]any)
		c["dra"].(map[string]any)["enabled"] = true
		c["devicePlugin"].(map[string]any)["enabled"] = false
		v["nvidiaGPUResource"] = res
	})
	return objs
}

// TestDRAClosedByDefault: the shipped manifests and the chart's defaults
// have the DRA driver off: no DeviceClass, none of its RBAC, none of its
// host directories mounted (the service account token is the pods'
// Events', TestEventsShipped).
func TestDRAClosedByDefault(t *testing.T) {
	plain, _ := loadKubernetes(t)
	chart, values := renderHelm(t, nil)
	if values.NVIDIAGPUResource != "devicePlugin" {
		t.Errorf("nvidiaGPUResource %q, want devicePlugin", values.NVIDIAGPUResource)
	}
	for name, objs := range map[string]objects{"deploy/kubernetes": plain, "helm": chart} {
		if parseShipped(t, objs).DRA.Enabled {
			t.Errorf("%s: dra.enabled", name)
		}
		if len(objs.deviceClasses) != 0 || len(roles(objs, draRole)) != 0 || len(bindings(objs, draRole)) != 0 {
			t.Errorf("%s: DRA objects rendered with DRA off", name)
		}
		spec := objs.daemonSet.Spec.Template.Spec
		if got := hostPaths(spec); hasAny(got, draDirs) {
			t.Errorf("%s: DRA directories mounted with DRA off: %v", name, got)
		}
	}
}

// TestDRAShipped: the chart with config.dra.enabled and the overlay
// deploy/kubernetes-dra render the same DeviceClasses (NVIDIA's
// expressions with device.driver changed), the same least RBAC, the
// service account token, NODE_NAME from the downward API, and the DRA
// driver's three host directories mounted read-write at the paths its
// configuration names; nothing else of the host is writable beyond the
// defaults. nvidiaGPUResource: dra adds extendedResourceName.
func TestDRAShipped(t *testing.T) {
	chart := withDRA(t, "devicePlugin")
	checkDaemonSet(t, chart)
	overlay := loadOverlay(t)
	if diff := cmp.Diff(overlay.deviceClasses, chart.deviceClasses, withoutHelmMetadata()); diff != "" {
		t.Errorf("DeviceClasses: overlay vs chart (-overlay +chart):\n%s", diff)
	}
	if diff := cmp.Diff(overlay.clusterRoles, roles(chart, draRole), withoutHelmMetadata()); diff != "" {
		t.Errorf("ClusterRole: overlay vs chart (-overlay +chart):\n%s", diff)
	}
	if diff := cmp.Diff(overlay.bindings, bindings(chart, draRole), withoutHelmMetadata()); diff != "" {
		t.Errorf("ClusterRoleBinding: overlay vs chart (-overlay +chart):\n%s", diff)
	}
	if diff := cmp.Diff(overlay.configMap.Data, chart.configMap.Data); diff != "" {
		t.Errorf("configuration: overlay vs chart (-overlay +chart):\n%s", diff)
	}
	want := []string{
		"device.driver == 'gpu.nri-gpu.dev' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
		"device.driver == 'gpu.nri-gpu.dev' && device.attributes['gpu.nvidia.com'].type == 'mig'",
	}
	for i, dc := range chart.deviceClasses {
		if got := dc.Spec.Selectors[0].CEL.Expression; got != want[i] || dc.Spec.ExtendedResourceName != nil {
			t.Errorf("DeviceClass %s: %q, extendedResourceName %v", dc.Name, got, dc.Spec.ExtendedResourceName)
		}
	}
	rules := map[string][]string{}
	for _, r := range roles(chart, draRole)[0].Rules {
		for _, res := range r.Resources {
			rules[r.APIGroups[0]+"/"+res] = r.Verbs
		}
	}
	wantRules := map[string][]string{"resource.k8s.io/resourceslices": {"list", "watch", "create", "update", "delete"},
		"resource.k8s.io/resourceclaims": {"get"}, "/nodes": {"get"}}
	if diff := cmp.Diff(wantRules, rules); diff != "" {
		t.Errorf("RBAC (-want +got):\n%s", diff)
	}
	if b := bindings(chart, draRole)[0]; b.Subjects[0].Name != chart.serviceAccount.Name || b.Subjects[0].Namespace != "nri-gpu" || b.RoleRef.Name != draRole {
		t.Errorf("binding %+v", b)
	}
	c := parseShipped(t, chart)
	if !c.DRA.Enabled || c.DevicePlugin.Enabled {
		t.Errorf("dra %v, devicePlugin %v", c.DRA.Enabled, c.DevicePlugin.Enabled)
	}
	spec := chart.daemonSet.Spec.Template.Spec
	if !*spec.AutomountServiceAccountToken || !*chart.serviceAccount.AutomountServiceAccountToken {
		t.Error("no service account token with DRA on")
	}
	var nodeName *corev1.EnvVar
	for i, e := range spec.Containers[0].Env {
		if e.Name == "NODE_NAME" {
			nodeName = &spec.Containers[0].Env[i]
		}
	}
	if nodeName == nil || nodeName.ValueFrom == nil || nodeName.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME %+v, want the downward API's spec.nodeName", nodeName)
	}
	mounts := map[string]string{}
	for _, m := range spec.Containers[0].VolumeMounts {
		if !m.ReadOnly {
			mounts[m.Name] = m.MountPath
		}
	}
	for _, dir := range []string{c.DRA.PluginDir, c.DRA.RegistrationDir, c.DRA.CDIDir} {
		found := false
		for name, at := range mounts {
			for _, v := range spec.Volumes {
				if v.Name == name && v.HostPath != nil && v.HostPath.Path == dir && at == dir {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("host %s is not mounted read-write at %s", dir, dir)
		}
	}
	// The overlay's DaemonSet patch adds the same mounts and variable.
	if diff := cmp.Diff(hostPaths(spec), append(hostPaths(overlay.daemonSet.Spec.Template.Spec), hostPathsOf(t, "kubernetes/daemonset.yaml")...), cmpSorted()); diff != "" {
		t.Errorf("host paths: chart vs base + overlay patch (-chart +overlay):\n%s", diff)
	}

	ext := withDRA(t, "dra")
	if n := ext.deviceClasses[0].Spec.ExtendedResourceName; n == nil || *n != "nvidia.com/gpu" || ext.deviceClasses[1].Spec.ExtendedResourceName != nil {
		t.Errorf("nvidiaGPUResource dra: extendedResourceName %v on %s", n, ext.deviceClasses[0].Name)
	}
}

// TestDRABesideDevicePlugin: config.dra.enabled alone (helm install
// --set config.dra.enabled=true) renders what deploy/kubernetes-dra does:
// the device plugin off (a GPU is offered by one allocator) and a
// configuration nri-gpu accepts, not one it refuses on every node; with
// disjoint devices lists both run; with one list only, helm template
// fails and says why.
func TestDRABesideDevicePlugin(t *testing.T) {
	alone, _ := renderHelm(t, func(v map[string]any) {
		v["config"].(map[string]any)["dra"].(map[string]any)["enabled"] = true
	})
	checkDaemonSet(t, alone)
	c := parseShipped(t, alone)
	if !c.DRA.Enabled || c.DevicePlugin.Enabled {
		t.Errorf("--set config.dra.enabled=true: dra %v, devicePlugin %v; want the DRA driver alone", c.DRA.Enabled, c.DevicePlugin.Enabled)
	}
	if diff := cmp.Diff(loadOverlay(t).configMap.Data, alone.configMap.Data); diff != "" {
		t.Errorf("--set config.dra.enabled=true: configuration differs from deploy/kubernetes-dra's (-overlay +chart):\n%s", diff)
	}
	if got := hostPaths(alone.daemonSet.Spec.Template.Spec); slices.Contains(got, kubeletDevicePlugins) {
		t.Errorf("device plugin off, and the kubelet's %s still mounted", kubeletDevicePlugins)
	}

	split, _ := renderHelm(t, func(v map[string]any) {
		c := v["config"].(map[string]any)
		c["dra"].(map[string]any)["enabled"] = true
		c["dra"].(map[string]any)["devices"] = []any{"0", "1"}
		c["devicePlugin"].(map[string]any)["devices"] = []any{"2", "3"}
	})
	checkDaemonSet(t, split)
	if c := parseShipped(t, split); !c.DRA.Enabled || !c.DevicePlugin.Enabled {
		t.Errorf("disjoint lists: dra %v, devicePlugin %v; want both", c.DRA.Enabled, c.DevicePlugin.Enabled)
	}

	for _, key := range []string{"dra", "devicePlugin"} {
		values := map[string]any{"config": map[string]any{"dra": map[string]any{"enabled": true}, "devicePlugin": map[string]any{}}}
		values["config"].(map[string]any)[key].(map[string]any)["devices"] = []any{"0"}
		_, err := helmTemplate(t, []map[string]any{values})
		if err == nil || !strings.Contains(err.Error(), "give both config.devicePlugin.devices and config.dra.devices") {
			t.Errorf("dra.enabled with %s.devices alone: helm template %v, want it to fail naming both lists", key, err)
		}
	}
}

// loadOverlay reads deploy/kubernetes-dra: its own objects, and the
// patched ConfigMap and DaemonSet as the patch files give them.
func loadOverlay(t *testing.T) objects {
	t.Helper()
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
		Patches    []struct {
			Path string `json:"path"`
		} `json:"patches"`
	}
	data, err := os.ReadFile("kubernetes-dra/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatal(err)
	}
	files := k.Resources[1:]
	for _, p := range k.Patches {
		files = append(files, p.Path)
	}
	// The base is a sibling: kustomize refuses an overlay inside its
	// base's directory (a cycle: "candidate root contains visited root").
	if k.Resources[0] != "../kubernetes" {
		t.Errorf("the overlay's first resource %q, want ../kubernetes", k.Resources[0])
	}
	var objs objects
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join("kubernetes-dra", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range splitDocs(data) {
			decode(t, f, doc, &objs)
		}
	}
	return objs
}

func hostPaths(spec corev1.PodSpec) []string {
	var out []string
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			out = append(out, v.HostPath.Path)
		}
	}
	return out
}

func hostPathsOf(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var objs objects
	for _, doc := range splitDocs(data) {
		decode(t, file, doc, &objs)
	}
	var out []string
	for _, p := range hostPaths(objs.daemonSet.Spec.Template.Spec) {
		if p != kubeletDevicePlugins { // the chart drops it with the device plugin off
			out = append(out, p)
		}
	}
	return out
}

func hasAny(list, of []string) bool {
	for _, x := range of {
		for _, y := range list {
			if x == y {
				return true
			}
		}
	}
	return false
}

func cmpSorted() cmp.Option { return cmp.Transformer("sort", sorted) }
