package deploy

import (
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
)

// TestMPSDaemonSet decodes deploy/kubernetes/mps/daemonset.yaml strictly
// and checks it against nri-gpu's own manifests: the same namespace,
// service account, image and ConfigMap; the command nri-gpu mps; OnDelete
// updates (MPS clients die with their daemon); the discovery mounts where
// the ConfigMap's hostRoot and driverRootMount say; devicePlugin.mpsRoot
// mounted read-write from the host at its own path and its shm directory
// at /dev/shm.
func TestMPSDaemonSet(t *testing.T) {
	main, _ := loadKubernetes(t)
	data, err := os.ReadFile("kubernetes/mps/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var objs objects
	for _, doc := range splitDocs(data) {
		decode(t, "mps/daemonset.yaml", doc, &objs)
	}
	ds := objs.mpsDaemonSet
	if ds == nil || objs.daemonSet != nil || objs.configMap != nil {
		t.Fatalf("want one DaemonSet: %+v", objs)
	}
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	cfg, err := config.Parse([]byte(main.configMap.Data["config.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if ds.Namespace != main.daemonSet.Namespace || spec.ServiceAccountName != main.daemonSet.Spec.Template.Spec.ServiceAccountName ||
		c.Image != main.daemonSet.Spec.Template.Spec.Containers[0].Image || ds.Spec.UpdateStrategy.Type != "OnDelete" {
		t.Errorf("namespace %s, service account %s, image %s, updates %s", ds.Namespace, spec.ServiceAccountName, c.Image, ds.Spec.UpdateStrategy.Type)
	}
	if len(c.Args) != 4 || c.Args[0] != "mps" || c.Args[1] != "--config=/etc/nri-gpu/config.yaml" ||
		!slices.Equal(c.Args[2:], main.daemonSet.Spec.Template.Spec.Containers[0].Args[3:5]) {
		t.Errorf("args %q", c.Args)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("not privileged: NVML sets compute modes only as root with the GPUs' device nodes")
	}
	hostPath := map[string]*corev1.HostPathVolumeSource{}
	cmName := ""
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPath[v.Name] = v.HostPath
		}
		if v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	if cmName != main.configMap.Name {
		t.Errorf("ConfigMap %q, want %q", cmName, main.configMap.Name)
	}
	want := map[string]struct {
		host     string
		readOnly bool
	}{
		cfg.HostRoot + "/proc":   {"/proc", true},
		cfg.HostRoot + "/dev":    {"/dev", true},
		cfg.DriverRootMount:      {cfg.DriverRoot, true},
		cfg.DevicePlugin.MPSRoot: {cfg.DevicePlugin.MPSRoot, false},
		"/dev/shm":               {cfg.DevicePlugin.MPSRoot + "/shm", false},
		cfg.DRA.PluginDir:        {cfg.DRA.PluginDir, true},
	}
	for _, m := range c.VolumeMounts {
		w, ok := want[m.MountPath]
		if !ok {
			continue
		}
		if hp := hostPath[m.Name]; hp == nil || hp.Path != w.host || m.ReadOnly != w.readOnly {
			t.Errorf("mount %s: %+v from %+v, want host %s read-only %v", m.MountPath, m, hp, w.host, w.readOnly)
		}
		delete(want, m.MountPath)
	}
	if len(want) != 0 {
		t.Errorf("not mounted: %v", want)
	}
}
