package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
)

// objects are the decoded manifests of one deployment method.
type objects struct {
	namespace      *corev1.Namespace
	serviceAccount *corev1.ServiceAccount
	configMap      *corev1.ConfigMap
	daemonSet      *appsv1.DaemonSet
	// The DRA driver's (rendered only with config.dra.enabled).
	deviceClasses []*resourcev1.DeviceClass
	clusterRoles  []*rbacv1.ClusterRole
	bindings      []*rbacv1.ClusterRoleBinding
	// The chart's others, each under its switch: the MPS daemons'
	// DaemonSet, the metrics Service, prometheus-operator's objects, the
	// NetworkPolicy and the Grafana dashboard's ConfigMap.
	mpsDaemonSet   *appsv1.DaemonSet
	service        *corev1.Service
	serviceMonitor *monitoringv1.ServiceMonitor
	podMonitor     *monitoringv1.PodMonitor
	rule           *monitoringv1.PrometheusRule
	networkPolicy  *networkingv1.NetworkPolicy
	dashboard      *corev1.ConfigMap
}

// apiUsers says what of the objects' configuration uses the API server:
// the DRA driver, the pods' Events; "" for nothing.
func apiUsers(t *testing.T, objs objects) string {
	t.Helper()
	c, err := config.Parse([]byte(objs.configMap.Data["config.yaml"]))
	if err != nil {
		return ""
	}
	var users []string
	if c.DRA.Enabled {
		users = append(users, "dra")
	}
	if c.Events.On() {
		users = append(users, "events")
	}
	return strings.Join(users, ", ")
}

// splitDocs splits a multi-document YAML stream.
func splitDocs(data []byte) [][]byte {
	var out [][]byte
	for _, d := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			out = append(out, d)
		}
	}
	return out
}

func stripComments(d []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(d, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// decode strict-decodes one document into its k8s.io/api type: unknown or
// duplicate fields are errors.
func decode(t *testing.T, name string, doc []byte, objs *objects) {
	t.Helper()
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var into any
	switch meta.APIVersion + " " + meta.Kind {
	case "v1 Namespace":
		objs.namespace = &corev1.Namespace{}
		into = objs.namespace
	case "v1 ServiceAccount":
		objs.serviceAccount = &corev1.ServiceAccount{}
		into = objs.serviceAccount
	case "v1 ConfigMap":
		into = &objs.configMap
		if strings.HasSuffix(meta.Metadata.Name, "-dashboard") {
			into = &objs.dashboard
		}
	case "apps/v1 DaemonSet":
		into = &objs.daemonSet
		if strings.HasSuffix(meta.Metadata.Name, "-mps") {
			into = &objs.mpsDaemonSet
		}
	case "v1 Service":
		into = &objs.service
	case "monitoring.coreos.com/v1 ServiceMonitor":
		into = &objs.serviceMonitor
	case "monitoring.coreos.com/v1 PodMonitor":
		into = &objs.podMonitor
	case "monitoring.coreos.com/v1 PrometheusRule":
		into = &objs.rule
	case "networking.k8s.io/v1 NetworkPolicy":
		into = &objs.networkPolicy
	case "resource.k8s.io/v1 DeviceClass":
		objs.deviceClasses = append(objs.deviceClasses, &resourcev1.DeviceClass{})
		into = objs.deviceClasses[len(objs.deviceClasses)-1]
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		objs.clusterRoles = append(objs.clusterRoles, &rbacv1.ClusterRole{})
		into = objs.clusterRoles[len(objs.clusterRoles)-1]
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		objs.bindings = append(objs.bindings, &rbacv1.ClusterRoleBinding{})
		into = objs.bindings[len(objs.bindings)-1]
	default:
		t.Fatalf("%s: unexpected object %s %s", name, meta.APIVersion, meta.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		t.Fatalf("%s: strict decoding %s: %v", name, meta.Kind, err)
	}
}

// kustomization is the part of a kustomization.yaml the manifests use;
// decoded strictly, so a field kustomize would read and this test would
// not is an error.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewTag  string `json:"newTag"`
		NewName string `json:"newName,omitempty"`
	} `json:"images"`
}

func loadKubernetes(t *testing.T) (objects, kustomization) {
	t.Helper()
	var k kustomization
	data, err := os.ReadFile("kubernetes/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	files, _ := filepath.Glob("kubernetes/*.yaml")
	var listed []string
	for _, f := range files {
		if filepath.Base(f) != "kustomization.yaml" {
			listed = append(listed, filepath.Base(f))
		}
	}
	if !cmp.Equal(sorted(k.Resources), sorted(listed)) {
		t.Errorf("kustomization resources %v, manifests in the directory %v", k.Resources, listed)
	}
	var objs objects
	for _, r := range k.Resources {
		data, err := os.ReadFile(filepath.Join("kubernetes", r))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range splitDocs(data) {
			decode(t, r, doc, &objs)
		}
	}
	return objs, k
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// helmValues are the parts of the chart's values the tests read
// (values.schema.json holds them all: TestValuesSchema).
type helmValues struct {
	Image struct {
		Repository string `json:"repository"`
		Tag        string `json:"tag"`
	} `json:"image"`
	KubeletDevicePlugin string `json:"kubeletDevicePluginHostPath"`
	NVIDIAGPUResource   string `json:"nvidiaGPUResource"`
}

// chartValues reads the chart's values.yaml.
func chartValues(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	return values
}

// renderHelm renders the chart with helm template (release nri-gpu in
// namespace nri-gpu) and its default values changed by override, and
// decodes the objects strictly.
func renderHelm(t *testing.T, override func(values map[string]any)) (objects, helmValues) {
	t.Helper()
	values := chartValues(t)
	var typed helmValues
	data, _ := yaml.Marshal(values)
	if err := yaml.Unmarshal(data, &typed); err != nil {
		t.Fatal(err)
	}
	var files []map[string]any
	if override != nil {
		override(values)
		files = append(files, values)
	}
	out, err := helmTemplate(t, files)
	if err != nil {
		t.Fatal(err)
	}
	return decodeRendered(t, out), typed
}

// decodeRendered decodes helm template's output strictly.
func decodeRendered(t *testing.T, out string) objects {
	t.Helper()
	var objs objects
	for _, doc := range splitDocs([]byte(out)) {
		source := "helm template"
		if line, _, ok := strings.Cut(strings.TrimLeft(string(doc), "-\n"), "\n"); ok && strings.HasPrefix(line, "# Source: ") {
			source = strings.TrimPrefix(line, "# Source: ")
		}
		decode(t, source, doc, &objs)
	}
	return objs
}

// TestKubernetesManifests checks the invariants of deploy/kubernetes.
func TestKubernetesManifests(t *testing.T) {
	objs, k := loadKubernetes(t)
	if objs.namespace == nil || objs.serviceAccount == nil || objs.configMap == nil || objs.daemonSet == nil {
		t.Fatalf("missing objects: %+v", objs)
	}
	ns := objs.namespace.Name
	for what, got := range map[string]string{
		"kustomization": k.Namespace, "ServiceAccount": objs.serviceAccount.Namespace,
		"ConfigMap": objs.configMap.Namespace, "DaemonSet": objs.daemonSet.Namespace,
	} {
		if got != ns {
			t.Errorf("%s namespace %q, want %q", what, got, ns)
		}
	}
	checkDaemonSet(t, objs)

	img := objs.daemonSet.Spec.Template.Spec.Containers[0].Image
	repo, tag, _ := strings.Cut(img, ":")
	if len(k.Images) != 1 || k.Images[0].Name != repo || k.Images[0].NewTag != tag {
		t.Errorf("kustomization images %+v do not match the DaemonSet's image %s", k.Images, img)
	}
}

// TestHelmChart checks that the chart with its default values renders the
// same objects as deploy/kubernetes, and the chart's metadata.
func TestHelmChart(t *testing.T) {
	plain, _ := loadKubernetes(t)
	helm, values := renderHelm(t, nil)
	if helm.namespace != nil {
		t.Error("the chart creates its namespace; helm --create-namespace does")
	}
	for name, pair := range map[string][2]any{
		"ServiceAccount": {plain.serviceAccount, helm.serviceAccount},
		"ConfigMap":      {plain.configMap, helm.configMap},
		"DaemonSet":      {plain.daemonSet, helm.daemonSet},
	} {
		if d := cmp.Diff(pair[0], pair[1], withoutHelmMetadata()); d != "" {
			t.Errorf("%s: chart differs from deploy/kubernetes (-plain +chart):\n%s", name, d)
		}
	}
	checkDaemonSet(t, helm)

	var chart struct {
		APIVersion  string `json:"apiVersion"`
		Name        string `json:"name"`
		Description string `json:"description"`
		Type        string `json:"type"`
		Version     string `json:"version"`
		AppVersion  string `json:"appVersion"`
	}
	data, err := os.ReadFile("helm/nri-gpu/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &chart); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	if chart.APIVersion != "v2" || chart.Name != "nri-gpu" || chart.AppVersion != values.Image.Tag {
		t.Errorf("Chart.yaml %+v: appVersion must be the image tag %q", chart, values.Image.Tag)
	}
}

// helmOnly are the labels only Helm's objects carry: the chart's
// version, Helm as their manager, the app's version.
var helmOnly = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"}

// withoutHelmMetadata compares objects without the helmOnly labels.
func withoutHelmMetadata() cmp.Option {
	return cmp.Transformer("withoutHelmOnly", func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			if !slices.Contains(helmOnly, k) {
				out[k] = v
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	})
}

// hostPathsJustified are the host paths the pod may mount, each for the
// reason given in daemonset.yaml; the driver root is added from the
// configuration.
var hostPathsJustified = map[string]bool{"/var/run/nri": true, "/proc": true, "/dev": true, "/dev/char": true, "/sys": true}

// kubeletDevicePlugins is the kubelet's device plugin directory, mounted
// read-write when the configuration turns the device plugin on.
const kubeletDevicePlugins = "/var/lib/kubelet/device-plugins"

// checkDaemonSet checks the DaemonSet's invariants against the ConfigMap
// and the plugin's own configuration parser.
func checkDaemonSet(t *testing.T, objs objects) {
	t.Helper()
	ds := objs.daemonSet
	spec := ds.Spec.Template.Spec
	if !cmp.Equal(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("selector %v does not match the pod labels %v", ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	}
	if spec.ServiceAccountName != objs.serviceAccount.Name {
		t.Errorf("serviceAccountName %q, account %q", spec.ServiceAccountName, objs.serviceAccount.Name)
	}
	if api := apiUsers(t, objs); spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken != (api != "") {
		t.Errorf("the service account token is mounted: %v; only the DRA driver and the pods' Events use the API (here: %q)", spec.AutomountServiceAccountToken, api)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", spec.PriorityClassName)
	}
	if (spec.Affinity == nil || spec.Affinity.NodeAffinity == nil) && len(spec.NodeSelector) == 0 || len(spec.Tolerations) == 0 {
		t.Error("no node affinity or selector, or no tolerations")
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Error("host network, PID or IPC namespace: not needed")
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 {
		t.Fatalf("%d containers, %d init containers", len(spec.Containers), len(spec.InitContainers))
	}
	c := spec.Containers[0]

	// Privileges: none beyond uid 0.
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("no securityContext")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("privileged: true (not justified: nri-gpu needs no capability)")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("allowPrivilegeEscalation is not false")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("the root file system is writable")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
		t.Errorf("capabilities %+v: want all dropped", sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Error("seccomp profile is not RuntimeDefault")
	}

	// Arguments, configuration and ports.
	var cfgArg, metricsArg string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			cfgArg = v
		}
		if v, ok := strings.CutPrefix(a, "--metrics-addr="); ok {
			metricsArg = v
		}
	}
	if len(c.Args) == 0 || c.Args[0] != "run" || cfgArg == "" || metricsArg == "" {
		t.Fatalf("args %q: want run --config=... --metrics-addr=...", c.Args)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	cfgMount, ok := mounts[filepath.Dir(cfgArg)]
	if !ok || volumes[cfgMount.Name].ConfigMap == nil || volumes[cfgMount.Name].ConfigMap.Name != objs.configMap.Name {
		t.Fatalf("--config=%s is not in a mount of ConfigMap %s", cfgArg, objs.configMap.Name)
	}
	cfgText, ok := objs.configMap.Data[filepath.Base(cfgArg)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", objs.configMap.Name, filepath.Base(cfgArg))
	}
	cfg, err := config.Parse([]byte(cfgText))
	if err != nil {
		t.Fatalf("ConfigMap %s: nri-gpu rejects its configuration: %v", objs.configMap.Name, err)
	}
	// Capabilities: none, but with dra.dynamicMIG exactly what making
	// MIG devices takes (dynamicMIGCaps).
	var wantCaps []corev1.Capability
	if cfg.DRA.DynamicMIG.Enabled() {
		wantCaps = dynamicMIGCaps
	}
	if sc.Capabilities != nil && !slices.Equal(sc.Capabilities.Add, wantCaps) {
		t.Errorf("capabilities added %q, want %q (dra.dynamicMIG %v)", sc.Capabilities.Add, wantCaps, cfg.DRA.DynamicMIG.Devices)
	}
	var metricsPort *corev1.ContainerPort
	for i := range c.Ports {
		if c.Ports[i].Name == "metrics" {
			metricsPort = &c.Ports[i]
		}
	}
	if metricsPort == nil || !strings.HasSuffix(metricsArg, fmt.Sprintf(":%d", metricsPort.ContainerPort)) {
		t.Errorf("--metrics-addr=%s does not listen on the metrics port %+v", metricsArg, metricsPort)
	}
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		want := map[string]string{"readiness": "/readyz", "liveness": "/healthz"}[name]
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v: want GET %s on port metrics", name, p, want)
		}
	}

	// The status socket's directory (nri-gpu's default --status-socket
	// /run/nri-gpu/status.sock) is writable in a read-only root.
	if m, ok := mounts["/run/nri-gpu"]; !ok || volumes[m.Name].EmptyDir == nil || m.ReadOnly {
		t.Error("no writable emptyDir at /run/nri-gpu for the status socket")
	}

	// The record of the /dev/char links is in a host directory, writable,
	// so that a replaced pod finds it (an emptyDir goes with the pod, and
	// the links it lists would never be cleaned up).
	stateHost := ""
	if cfg.DevCharLinks.On() {
		dir := cfg.DevCharLinks.StateDirUnder(cfg.HostRoot)
		for _, m := range c.VolumeMounts {
			if v := volumes[m.Name]; (dir == m.MountPath || strings.HasPrefix(dir, m.MountPath+"/")) && v.HostPath != nil && !m.ReadOnly {
				stateHost = v.HostPath.Path
			}
		}
		if stateHost == "" {
			t.Errorf("devCharLinks.stateDir %s is not in a writable host directory mount", dir)
		}
	}

	// Host mounts: the ones hostRoot and driverRoot need and the library
	// cache, all read-only but the NRI socket's directory and the cache,
	// and nothing else. The cache is the host directory the runtime mounts
	// library directories from (driverRoot + libraryCache), mounted where
	// nri-gpu writes it (libraryCacheMount).
	usesCache := cfg.LibraryMode != config.LibraryFiles
	cacheHost := filepath.Join(cfg.DriverRoot, cfg.LibraryCache)
	cacheMount := cfg.LibraryCacheMount
	if cacheMount == "" {
		cacheMount = filepath.Join(cfg.DriverRootMount, cfg.LibraryCache)
	}
	hostMounts := map[string]string{} // host path -> mount path
	for _, m := range c.VolumeMounts {
		v := volumes[m.Name]
		if v.HostPath == nil {
			continue
		}
		hostMounts[v.HostPath.Path] = m.MountPath
		isCache := usesCache && v.HostPath.Path == cacheHost || v.HostPath.Path == stateHost
		// The kubelet's device plugin directory: where the plugin's
		// socket is made and the kubelet's is (devicePlugin.enabled).
		isKubelet := cfg.DevicePlugin.Enabled && v.HostPath.Path == kubeletDevicePlugins
		// The DRA driver's: its plugin directory (socket, checkpoint),
		// the kubelet's registration directory, the CDI directory of
		// the specs of prepared claims (dra.enabled), at their own paths.
		isDRA := cfg.DRA.Enabled && (v.HostPath.Path == cfg.DRA.PluginDir || v.HostPath.Path == cfg.DRA.RegistrationDir || v.HostPath.Path == cfg.DRA.CDIDir) && m.MountPath == v.HostPath.Path
		// The MPS daemons' ready files (devicePlugin.mpsRoot), read-only
		// at their own path: the client containers' mounts name it.
		isMPS := v.HostPath.Path == cfg.DevicePlugin.MPSRoot && m.MountPath == v.HostPath.Path && m.ReadOnly
		// dra.dynamicMIG: the host's /dev/nvidia-caps, where the
		// nodes of the MIG devices made on demand go.
		isCaps := cfg.DRA.DynamicMIG.Enabled() && v.HostPath.Path == "/dev/nvidia-caps" && m.MountPath == filepath.Join(cfg.HostRoot, "dev", "nvidia-caps")
		justified := hostPathsJustified[v.HostPath.Path] || v.HostPath.Path == cfg.DriverRoot || isCache || isKubelet || isDRA || isMPS || isCaps
		if !justified {
			t.Errorf("host path %s mounted without a reason", v.HostPath.Path)
		}
		// Writable: the NRI socket's directory (connecting needs write
		// access), and nri-gpu's own library cache; the driver root and
		// everything else of the host is read-only.
		// And /dev/char, where nri-gpu makes its links (devCharLinks).
		writable := v.HostPath.Path == "/var/run/nri" || isCache || isKubelet || isDRA || isCaps || v.HostPath.Path == "/dev/char" && cfg.DevCharLinks.On()
		if !m.ReadOnly && !writable {
			t.Errorf("host path %s is mounted writable; only the NRI socket's directory, nri-gpu's library cache (%s), the kubelet's device plugin directory and /dev/char (devCharLinks) may be", v.HostPath.Path, cacheHost)
		}
		if isKubelet && (m.ReadOnly || m.MountPath != cfg.DevicePlugin.SocketDir || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectory) {
			t.Errorf("the kubelet's %s is mounted at %s (read-only %v, type %v); want it read-write at devicePlugin.socketDir %s, type Directory",
				kubeletDevicePlugins, m.MountPath, m.ReadOnly, v.HostPath.Type, cfg.DevicePlugin.SocketDir)
		}
		if isCache && m.MountPath != cacheMount {
			t.Errorf("the library cache %s is mounted at %s; nri-gpu writes it at %s (libraryCacheMount)", cacheHost, m.MountPath, cacheMount)
		}
	}
	if _, ok := hostMounts["/dev/char"]; ok != cfg.DevCharLinks.On() {
		t.Errorf("devCharLinks.enabled is %v, and the host's /dev/char mounted: %v", cfg.DevCharLinks.On(), ok)
	}
	if _, ok := hostMounts["/dev/nvidia-caps"]; ok != cfg.DRA.DynamicMIG.Enabled() {
		t.Errorf("dra.dynamicMIG.devices is %q, and the host's /dev/nvidia-caps mounted: %v", cfg.DRA.DynamicMIG.Devices, ok)
	}
	if _, ok := hostMounts[kubeletDevicePlugins]; ok != cfg.DevicePlugin.Enabled {
		t.Errorf("devicePlugin.enabled is %v, and the kubelet's %s mounted: %v", cfg.DevicePlugin.Enabled, kubeletDevicePlugins, ok)
	}
	if _, ok := hostMounts[cacheHost]; usesCache && !ok {
		t.Errorf("libraryMode %s, and the library cache %s is not mounted read-write where nri-gpu writes it (%s)", cfg.LibraryMode, cacheHost, cacheMount)
	}
	for host, want := range map[string]string{
		"/proc":        filepath.Join(cfg.HostRoot, "proc"),
		"/dev":         filepath.Join(cfg.HostRoot, "dev"),
		cfg.DriverRoot: cfg.DriverRootMount,
		"/var/run/nri": "/var/run/nri", // the default --socket /var/run/nri/nri.sock
		"/dev/char":    filepath.Join(cfg.HostRoot, "dev", "char"),
	} {
		if _, ok := hostMounts[host]; host == "/dev/char" && !ok && !cfg.DevCharLinks.On() {
			continue
		}
		if hostMounts[host] != want {
			t.Errorf("host %s is mounted at %q; the configuration reads it at %q", host, hostMounts[host], want)
		}
	}

	// Resources from the measured footprint.
	req, lim := c.Resources.Requests, c.Resources.Limits
	if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	if lim.Memory().Cmp(*req.Memory()) < 0 {
		t.Error("memory limit below the request")
	}
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			v := strings.TrimSuffix(e.Value, "B") // Go writes MiB, Kubernetes Mi
			q, err := resource.ParseQuantity(v)
			if err != nil || q.Cmp(*lim.Memory()) >= 0 {
				t.Errorf("GOMEMLIMIT %s must be below the memory limit %s", e.Value, lim.Memory())
			}
		}
	}
}

// TestHelmLibraryModeFiles renders the chart with libraryMode files: no
// library cache; the host's /var/lib/nri-gpu stays mounted for the record
// of the /dev/char links, and goes with them (devCharLinks.enabled:
// false), with the host's /dev/char.
func TestHelmLibraryModeFiles(t *testing.T) {
	for _, devChar := range []bool{true, false} {
		objs, _ := renderHelm(t, func(v map[string]any) {
			v["config"].(map[string]any)["libraryMode"] = "files"
			v["config"].(map[string]any)["devCharLinks"].(map[string]any)["enabled"] = devChar
		})
		checkDaemonSet(t, objs)
		var mounted []string
		for _, m := range objs.daemonSet.Spec.Template.Spec.Containers[0].VolumeMounts {
			if m.Name == "library-cache" || m.Name == "host-dev-char" {
				mounted = append(mounted, m.Name)
			}
		}
		want := []string{"host-dev-char", "library-cache"}
		if !devChar {
			want = nil
		}
		if !slices.Equal(sorted(mounted), want) {
			t.Errorf("libraryMode files, devCharLinks.enabled %v: mounted %q, want %q", devChar, mounted, want)
		}
	}
}

// TestHelmDevCharLinksOff: devCharLinks.enabled: false renders a
// configuration with the links off and no mount of the host's /dev/char
// (docs/security.md), volume included.
func TestHelmDevCharLinksOff(t *testing.T) {
	objs, _ := renderHelm(t, func(v map[string]any) {
		v["config"].(map[string]any)["devCharLinks"].(map[string]any)["enabled"] = false
	})
	checkDaemonSet(t, objs)
	if parseShipped(t, objs).DevCharLinks.On() {
		t.Error("devCharLinks.enabled: false renders a configuration with the links on")
	}
	spec := objs.daemonSet.Spec.Template.Spec
	for _, v := range spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/dev/char" {
			t.Errorf("devCharLinks off: volume %s still mounts the host's /dev/char", v.Name)
		}
	}
	for _, m := range spec.Containers[0].VolumeMounts {
		if m.MountPath == "/host/dev/char" {
			t.Error("devCharLinks off: /host/dev/char still mounted")
		}
	}
}

// TestHelmHostRootHostPath renders the chart with hostRootHostPath set:
// the host's proc, dev, dev/char and sys volumes all come from under it,
// and nothing else moves.
func TestHelmHostRootHostPath(t *testing.T) {
	objs, _ := renderHelm(t, func(v map[string]any) { v["hostRootHostPath"] = "/run/nvidia/driver/" })
	got := map[string]string{}
	for _, v := range objs.daemonSet.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			got[v.Name] = v.HostPath.Path
		}
	}
	want := map[string]string{
		"nri-socket": "/var/run/nri", "host-proc": "/run/nvidia/driver/proc", "host-dev": "/run/nvidia/driver/dev",
		"host-dev-char": "/run/nvidia/driver/dev/char", "host-sys": "/run/nvidia/driver/sys", "driver-root": "/",
		"library-cache": "/var/lib/nri-gpu", "device-plugins": "/var/lib/kubelet/device-plugins", "mps-root": "/run/nri-gpu/mps",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("hostPath volumes (-want +got):\n%s", diff)
	}
}

// TestHostWritableOnlyOwnDirs checks the shipped DaemonSets' least
// privilege directly: every host path is mounted read-only except the
// runtime's NRI socket directory, nri-gpu's library cache
// (/var/lib/nri-gpu), the kubelet's device plugin directory (the
// plugin's socket, docs/security.md) and /dev/char (devCharLinks), and the
// only other writable mount is the emptyDir of the status socket
// (/run/nri-gpu).
func TestHostWritableOnlyOwnDirs(t *testing.T) {
	plain, _ := loadKubernetes(t)
	helm, _ := renderHelm(t, nil)
	for name, objs := range map[string]objects{"deploy/kubernetes": plain, "helm": helm} {
		spec := objs.daemonSet.Spec.Template.Spec
		volumes := map[string]corev1.Volume{}
		for _, v := range spec.Volumes {
			volumes[v.Name] = v
		}
		var writable []string
		for _, m := range spec.Containers[0].VolumeMounts {
			if m.ReadOnly {
				continue
			}
			v := volumes[m.Name]
			switch {
			case v.HostPath != nil:
				writable = append(writable, "host "+v.HostPath.Path+" at "+m.MountPath)
			default:
				writable = append(writable, m.MountPath)
			}
		}
		want := []string{"/run/nri-gpu", "host /var/run/nri at /var/run/nri", "host /var/lib/nri-gpu at /var/lib/nri-gpu",
			"host /var/lib/kubelet/device-plugins at /var/lib/kubelet/device-plugins", "host /dev/char at /host/dev/char"}
		if !cmp.Equal(sorted(writable), sorted(want)) {
			t.Errorf("%s: writable mounts %q, want exactly %q", name, writable, want)
		}
	}
}

// TestDevicePluginShipped: the shipped configurations turn nri-gpu's
// device plugin on for nvidia.com/gpu in the kubelet's directory, which
// the DaemonSet mounts read-write (checkDaemonSet); the chart's
// config.devicePlugin.enabled: false (a cluster that keeps NVIDIA's device
// plugin) turns it off and mounts no kubelet directory, and the policy
// stays closed either way.
func TestDevicePluginShipped(t *testing.T) {
	plain, _ := loadKubernetes(t)
	chart, values := renderHelm(t, nil)
	for name, objs := range map[string]objects{"deploy/kubernetes": plain, "helm": chart} {
		dp := parseShipped(t, objs).DevicePlugin
		if !dp.Enabled || dp.ResourceName != "nvidia.com/gpu" || dp.SocketDir != kubeletDevicePlugins || dp.DevRoot != "/dev" {
			t.Errorf("%s: devicePlugin %+v, want enabled, nvidia.com/gpu in %s, devRoot /dev", name, dp, kubeletDevicePlugins)
		}
	}
	if values.KubeletDevicePlugin != kubeletDevicePlugins {
		t.Errorf("kubeletDevicePluginHostPath %q, want %s", values.KubeletDevicePlugin, kubeletDevicePlugins)
	}

	off, _ := renderHelm(t, func(v map[string]any) {
		v["config"].(map[string]any)["devicePlugin"].(map[string]any)["enabled"] = false
	})
	checkDaemonSet(t, off)
	if parseShipped(t, off).DevicePlugin.Enabled {
		t.Error("devicePlugin.enabled: false renders a configuration with the device plugin on")
	}
	for _, v := range off.daemonSet.Spec.Template.Spec.Volumes {
		if v.HostPath != nil && strings.HasPrefix(v.HostPath.Path, "/var/lib/kubelet") {
			t.Errorf("device plugin off: the kubelet's %s is still mounted", v.HostPath.Path)
		}
	}
	checkClosed(t, "chart with the device plugin off", parseShipped(t, off).Policy)
}
