package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// dynamicMIGCaps are the capabilities dra.dynamicMIG adds to nri-gpu's
// pod, and the only ones any shipped configuration adds: CAP_SYS_ADMIN
// (NVIDIA's driver creates and destroys GPU and compute instances for an
// administrator only) and CAP_MKNOD (the instances' nvidia-caps nodes).
var dynamicMIGCaps = []corev1.Capability{"SYS_ADMIN", "MKNOD"}

// capsVolume is the volume of the host's /dev/nvidia-caps.
const capsVolume = "host-dev-nvidia-caps"

// withDynamicMIG renders the chart with the DRA driver on and
// dra.dynamicMIG.devices set, and change applied to the values.
func withDynamicMIG(t *testing.T, change func(map[string]any)) objects {
	t.Helper()
	objs, _ := renderHelm(t, func(v map[string]any) {
		c := v["config"].(map[string]any)
		c["dra"].(map[string]any)["enabled"] = true
		c["dra"].(map[string]any)["dynamicMIG"] = map[string]any{"devices": []any{"0", "GPU-1"}}
		if change != nil {
			change(v)
		}
	})
	return objs
}

// withoutDynamicMIG is spec without what dra.dynamicMIG adds: the added
// capabilities, the /dev/nvidia-caps volume and its mount.
func withoutDynamicMIG(spec corev1.PodSpec) corev1.PodSpec {
	spec = *spec.DeepCopy()
	c := &spec.Containers[0]
	c.SecurityContext.Capabilities.Add = nil
	c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == capsVolume })
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == capsVolume })
	return spec
}

// TestDynamicMIGSwitch: MIG made on demand is the one switch that gives
// nri-gpu's pod capabilities. The shipped manifests, the chart's
// defaults and the chart with the DRA driver on add none and mount no
// /dev/nvidia-caps (checkDaemonSet checks every render against its own
// configuration); config.dra.dynamicMIG.devices adds exactly SYS_ADMIN and
// MKNOD and the host's /dev/nvidia-caps writable at /host/dev/nvidia-caps
// (under hostRootHostPath), and changes nothing else of the pod; the
// kustomize component deploy/kubernetes-dra-dynamic-mig adds the same;
// the list without config.dra.enabled fails helm template, saying why.
func TestDynamicMIGSwitch(t *testing.T) {
	plain, _ := loadKubernetes(t)
	chart, _ := renderHelm(t, nil)
	dra := withDRA(t, "devicePlugin")
	for name, objs := range map[string]objects{"deploy/kubernetes": plain, "helm": chart, "helm, dra.enabled": dra} {
		checkDaemonSet(t, objs)
		spec := objs.daemonSet.Spec.Template.Spec
		if add := spec.Containers[0].SecurityContext.Capabilities.Add; len(add) != 0 {
			t.Errorf("%s: capabilities added %q without dra.dynamicMIG", name, add)
		}
		if slices.Contains(hostPaths(spec), "/dev/nvidia-caps") {
			t.Errorf("%s: the host's /dev/nvidia-caps mounted without dra.dynamicMIG", name)
		}
	}

	on := withDynamicMIG(t, func(v map[string]any) {
		// as withDRA: the device plugin off, one allocator.
		v["config"].(map[string]any)["devicePlugin"].(map[string]any)["enabled"] = false
	})
	checkDaemonSet(t, on)
	if got := parseShipped(t, on).DRA.DynamicMIG.Devices; !slices.Equal(got, []string{"0", "GPU-1"}) {
		t.Errorf("rendered dra.dynamicMIG.devices %q", got)
	}
	spec := on.daemonSet.Spec.Template.Spec
	sc := spec.Containers[0].SecurityContext
	if !slices.Equal(sc.Capabilities.Add, dynamicMIGCaps) || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		*sc.Privileged || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("dra.dynamicMIG: securityContext %+v, want all capabilities dropped but %q, not privileged, no escalation, a read-only root", sc, dynamicMIGCaps)
	}
	var mount *corev1.VolumeMount
	for i, m := range spec.Containers[0].VolumeMounts {
		if m.Name == capsVolume {
			mount = &spec.Containers[0].VolumeMounts[i]
		}
	}
	var volume *corev1.Volume
	for i, v := range spec.Volumes {
		if v.Name == capsVolume {
			volume = &spec.Volumes[i]
		}
	}
	if mount == nil || mount.ReadOnly || mount.MountPath != "/host/dev/nvidia-caps" || volume == nil || volume.HostPath == nil ||
		volume.HostPath.Path != "/dev/nvidia-caps" || *volume.HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Fatalf("dra.dynamicMIG: mount %+v of volume %+v; want the host's /dev/nvidia-caps read-write at /host/dev/nvidia-caps", mount, volume)
	}
	if diff := cmp.Diff(withoutDynamicMIG(dra.daemonSet.Spec.Template.Spec), withoutDynamicMIG(spec)); diff != "" {
		t.Errorf("dra.dynamicMIG changes more of the pod than its capabilities and /dev/nvidia-caps (-dra.enabled +dra.dynamicMIG):\n%s", diff)
	}

	moved := withDynamicMIG(t, func(v map[string]any) { v["hostRootHostPath"] = "/run/nvidia/driver" })
	if !slices.Contains(hostPaths(moved.daemonSet.Spec.Template.Spec), "/run/nvidia/driver/dev/nvidia-caps") {
		t.Errorf("hostRootHostPath /run/nvidia/driver: host paths %q, want /run/nvidia/driver/dev/nvidia-caps", hostPaths(moved.daemonSet.Spec.Template.Spec))
	}

	// The component's patch: the same capabilities, volume and mount.
	var k struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Patches    []struct {
			Path string `json:"path"`
		} `json:"patches"`
	}
	data, err := os.ReadFile(filepath.Join("kubernetes-dra-dynamic-mig", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatal(err)
	}
	if k.Kind != "Component" || len(k.Patches) != 1 {
		t.Fatalf("deploy/kubernetes-dra-dynamic-mig: kind %s, patches %v; want a Component of one DaemonSet patch", k.Kind, k.Patches)
	}
	data, err = os.ReadFile(filepath.Join("kubernetes-dra-dynamic-mig", k.Patches[0].Path))
	if err != nil {
		t.Fatal(err)
	}
	var patch appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(data, &patch); err != nil {
		t.Fatal(err)
	}
	ps := patch.Spec.Template.Spec
	want := corev1.PodSpec{
		Containers: []corev1.Container{{Name: "nri-gpu", SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: dynamicMIGCaps}},
			VolumeMounts: []corev1.VolumeMount{*mount}}},
		Volumes: []corev1.Volume{*volume},
	}
	if diff := cmp.Diff(want, ps); diff != "" {
		t.Errorf("the component's DaemonSet patch is not what the chart adds (-chart +component):\n%s", diff)
	}

	values := map[string]any{"config": map[string]any{"dra": map[string]any{"dynamicMIG": map[string]any{"devices": []any{"0"}}}}}
	if _, err := helmTemplate(t, []map[string]any{values}); err == nil || !strings.Contains(err.Error(), "config.dra.dynamicMIG.devices needs config.dra.enabled") {
		t.Errorf("dra.dynamicMIG.devices without dra.enabled: helm template %v, want it to fail saying why", err)
	}
}
