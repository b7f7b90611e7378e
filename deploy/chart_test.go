package deploy

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/internal/ops/metrics"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// set returns an override that sets each dotted path of kv to its value
// in the chart's values, as helm --set does.
func set(kv ...any) func(map[string]any) {
	return func(v map[string]any) {
		for i := 0; i < len(kv); i += 2 {
			m := v
			keys := strings.Split(kv[i].(string), ".")
			for _, k := range keys[:len(keys)-1] {
				next, ok := m[k].(map[string]any)
				if !ok {
					next = map[string]any{}
					m[k] = next
				}
				m = next
			}
			m[keys[len(keys)-1]] = kv[i+1]
		}
	}
}

// values returns the chart's values changed by override.
func values(t *testing.T, override func(map[string]any)) map[string]any {
	v := chartValues(t)
	override(v)
	return v
}

// monitoring turns every monitoring switch on but the PodMonitor.
var monitoring = set("metrics.serviceMonitor.enabled", true, "metrics.prometheusRule.enabled", true,
	"metrics.grafanaDashboard.enabled", true, "networkPolicy.enabled", true,
	"networkPolicy.metricsFrom", []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}})

// TestChartSwitches renders the chart with each switch, and with all at
// once, through helm lint --strict and helm template, decodes every
// object strictly into its API type, and checks the DaemonSet's
// invariants (checkDaemonSet) and that each switch renders what it says
// and nothing beside.
func TestChartSwitches(t *testing.T) {
	type want struct {
		mps, service, serviceMonitor, podMonitor, rule, networkPolicy, dashboard bool
		deviceClasses, rbac                                                      int
	}
	for _, c := range []struct {
		name     string
		override func(map[string]any)
		want     want
	}{
		{"defaults", set(), want{service: true}},
		{"dra", set("config.dra.enabled", true), want{service: true, deviceClasses: 2, rbac: 1}},
		{"dra extended resource", set("config.dra.enabled", true, "nvidiaGPUResource", "dra"), want{service: true, deviceClasses: 2, rbac: 1}},
		{"dra without DeviceClasses", set("config.dra.enabled", true, "deviceClasses.enabled", false), want{service: true, rbac: 1}},
		{"device plugin off", set("config.devicePlugin.enabled", false), want{service: true}},
		{"library files, no links", set("config.libraryMode", "files", "config.devCharLinks.enabled", false), want{service: true}},
		{"mps", set("mps.enabled", true), want{service: true, mps: true}},
		{"no service", set("metrics.service.enabled", false), want{}},
		{"service monitor", set("metrics.serviceMonitor.enabled", true), want{service: true, serviceMonitor: true}},
		{"pod monitor", set("metrics.podMonitor.enabled", true, "metrics.service.enabled", false), want{podMonitor: true}},
		{"rules", set("metrics.prometheusRule.enabled", true), want{service: true, rule: true}},
		{"dashboard", set("metrics.grafanaDashboard.enabled", true, "metrics.grafanaDashboard.namespace", "monitoring"), want{service: true, dashboard: true}},
		{"network policy", set("networkPolicy.enabled", true), want{service: true, networkPolicy: true}},
		{"log, args, annotations, pull secrets, NFD", set("logLevel", "debug", "logFormat", "json", "extraArgs", []any{"--watch-interval=30s"},
			"podAnnotations", map[string]any{"example.com/team": "gpu"}, "imagePullSecrets", []any{map[string]any{"name": "registry"}},
			"affinity", map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
				"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{
					"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": []any{"true"}}}}}}}}),
			want{service: true}},
		{"everything", func(v map[string]any) {
			monitoring(v)
			set("config.dra.enabled", true, "mps.enabled", true)(v)
		}, want{service: true, serviceMonitor: true, rule: true, networkPolicy: true, dashboard: true, mps: true, deviceClasses: 2, rbac: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := values(t, c.override)
			objs := renderValues(t, v)
			checkDaemonSet(t, objs)
			got := want{mps: objs.mpsDaemonSet != nil, service: objs.service != nil, serviceMonitor: objs.serviceMonitor != nil,
				podMonitor: objs.podMonitor != nil, rule: objs.rule != nil, networkPolicy: objs.networkPolicy != nil, dashboard: objs.dashboard != nil,
				deviceClasses: len(objs.deviceClasses), rbac: len(roles(objs, draRole))}
			if got != c.want {
				t.Errorf("rendered %+v, want %+v", got, c.want)
			}
			if len(objs.bindings) != len(objs.clusterRoles) {
				t.Errorf("%d ClusterRoles, %d bindings", len(objs.clusterRoles), len(objs.bindings))
			}
		})
	}
}

// renderValues runs helm lint --strict and helm template with the values
// v and decodes the objects.
func renderValues(t *testing.T, v map[string]any) objects {
	t.Helper()
	f := valuesFile(t, v)
	if out, err := runHelm(t, "lint", "--strict", chartDir, "-f", f); err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
	out, err := runHelm(t, "template", "nri-gpu", chartDir, "--namespace", "nri-gpu", "-f", f)
	if err != nil {
		t.Fatal(err)
	}
	return decodeRendered(t, out)
}

// TestChartFlags: logLevel, logFormat and extraArgs reach nri-gpu run's
// arguments (and the MPS daemons' log flags), extraEnv its environment,
// podAnnotations and
// imagePullSecrets both pods, affinity and nodeSelector nri-gpu's pod.
func TestChartFlags(t *testing.T) {
	nfd := map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{
			"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": []any{"true"}}}}}}}}
	objs := renderValues(t, values(t, set("logLevel", "debug", "logFormat", "json", "extraArgs", []any{"--watch-interval=30s"},
		"extraEnv", []any{map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}},
		"podAnnotations", map[string]any{"example.com/team": "gpu"}, "imagePullSecrets", []any{map[string]any{"name": "registry"}},
		"affinity", nfd, "nodeSelector", map[string]any{"pool": "gpu"}, "mps.enabled", true)))
	ds, mps := objs.daemonSet.Spec.Template, objs.mpsDaemonSet.Spec.Template
	args := ds.Spec.Containers[0].Args
	for _, a := range []string{"--log-level=debug", "--log-format=json"} {
		if !slices.Contains(args, a) || !slices.Contains(mps.Spec.Containers[0].Args, a) {
			t.Errorf("%s: nri-gpu run %q, nri-gpu mps %q", a, args, mps.Spec.Containers[0].Args)
		}
	}
	if args[len(args)-1] != "--watch-interval=30s" {
		t.Errorf("extraArgs: args %q, want --watch-interval=30s last", args)
	}
	if env := ds.Spec.Containers[0].Env; env[len(env)-1] != (corev1.EnvVar{Name: "HTTPS_PROXY", Value: "http://proxy:3128"}) {
		t.Errorf("extraEnv: env %+v, want HTTPS_PROXY last", env)
	}
	for name, pod := range map[string]corev1.PodTemplateSpec{"nri-gpu": ds, "mps": mps} {
		if pod.Annotations["example.com/team"] != "gpu" {
			t.Errorf("%s: podAnnotations not on the pod: %v", name, pod.Annotations)
		}
		if !cmp.Equal(pod.Spec.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "registry"}}) {
			t.Errorf("%s: imagePullSecrets %v", name, pod.Spec.ImagePullSecrets)
		}
	}
	terms := ds.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || terms[0].MatchExpressions[0].Key != "feature.node.kubernetes.io/pci-10de.present" || ds.Spec.NodeSelector["pool"] != "gpu" {
		t.Errorf("affinity %+v, nodeSelector %v", terms, ds.Spec.NodeSelector)
	}

	def, _ := renderHelm(t, nil)
	terms = def.daemonSet.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != "nvidia.com/gpu.present" ||
		!slices.Equal(terms[0].MatchExpressions[0].Values, []string{"true"}) || len(def.daemonSet.Spec.Template.Spec.NodeSelector) != 0 {
		t.Errorf("default affinity %+v: want nodes labelled nvidia.com/gpu.present=true", terms)
	}
}

// TestReleaseNames: the objects are named after the release (or
// fullnameOverride), and every reference between them follows: the
// DaemonSets' service account and ConfigMap, the binding's subject and
// role, the Service's and the monitors' selectors; the DeviceClasses keep
// their names.
func TestReleaseNames(t *testing.T) {
	for _, c := range []struct {
		release string
		extra   []string
		name    string
	}{
		{"gpu", nil, "gpu-nri-gpu"},
		{"nri-gpu-prod", nil, "nri-gpu-prod"},
		{"gpu", []string{"--set", "fullnameOverride=accel"}, "accel"},
	} {
		args := append([]string{"template", c.release, chartDir, "-n", "gpu-system", "--set", "config.dra.enabled=true", "--set", "mps.enabled=true",
			"--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true"}, c.extra...)
		out, err := runHelm(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		objs := decodeRendered(t, out)
		spec := objs.daemonSet.Spec.Template.Spec
		names := map[string]string{
			"DaemonSet": objs.daemonSet.Name, "MPS DaemonSet": objs.mpsDaemonSet.Name, "ServiceAccount": objs.serviceAccount.Name,
			"ConfigMap": objs.configMap.Name, "Service": objs.service.Name, "ServiceMonitor": objs.serviceMonitor.Name,
			"NetworkPolicy": objs.networkPolicy.Name, "ClusterRole": objs.clusterRoles[0].Name, "ClusterRoleBinding": objs.bindings[0].Name,
			"run's service account": spec.ServiceAccountName, "mps's service account": objs.mpsDaemonSet.Spec.Template.Spec.ServiceAccountName,
			"binding's subject": objs.bindings[0].Subjects[0].Name, "binding's role": objs.bindings[0].RoleRef.Name,
		}
		for _, v := range append(spec.Volumes, objs.mpsDaemonSet.Spec.Template.Spec.Volumes...) {
			if v.ConfigMap != nil {
				names["a configuration volume"] = v.ConfigMap.Name
			}
		}
		want := map[string]string{
			"DaemonSet": c.name, "MPS DaemonSet": c.name + "-mps", "ServiceAccount": c.name, "ConfigMap": c.name + "-config",
			"Service": c.name + "-metrics", "ServiceMonitor": c.name, "NetworkPolicy": c.name, "ClusterRole": c.name + "-dra",
			"ClusterRoleBinding": c.name + "-dra", "run's service account": c.name, "mps's service account": c.name,
			"binding's subject": c.name, "binding's role": c.name + "-dra", "a configuration volume": c.name + "-config",
		}
		if diff := cmp.Diff(want, names); diff != "" {
			t.Errorf("release %s %v: names (-want +got):\n%s", c.release, c.extra, diff)
		}
		if objs.bindings[0].Subjects[0].Namespace != "gpu-system" || objs.daemonSet.Namespace != "gpu-system" {
			t.Errorf("release %s: namespace %s, subject's %s", c.release, objs.daemonSet.Namespace, objs.bindings[0].Subjects[0].Namespace)
		}
		if objs.deviceClasses[0].Name != "gpu.nri-gpu.dev" || objs.deviceClasses[1].Name != "mig.nri-gpu.dev" {
			t.Errorf("DeviceClasses %s, %s: claims name them", objs.deviceClasses[0].Name, objs.deviceClasses[1].Name)
		}
		pod := objs.daemonSet.Spec.Template.Labels
		if pod["app.kubernetes.io/instance"] != c.release || !subset(objs.daemonSet.Spec.Selector.MatchLabels, pod) ||
			!cmp.Equal(objs.service.Spec.Selector, objs.daemonSet.Spec.Selector.MatchLabels) ||
			subset(objs.mpsDaemonSet.Spec.Selector.MatchLabels, pod) || subset(objs.daemonSet.Spec.Selector.MatchLabels, objs.mpsDaemonSet.Spec.Template.Labels) {
			t.Errorf("release %s: pod labels %v, selectors: nri-gpu %v, Service %v, MPS %v", c.release, pod,
				objs.daemonSet.Spec.Selector.MatchLabels, objs.service.Spec.Selector, objs.mpsDaemonSet.Spec.Selector.MatchLabels)
		}
	}
}

// subset reports whether every label of sel is in labels.
func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestHelmMPSDaemonSet: mps.enabled renders deploy/kubernetes/mps's
// DaemonSet (for release nri-gpu in namespace nri-gpu), and follows the
// chart's host paths.
func TestHelmMPSDaemonSet(t *testing.T) {
	chart, _ := renderHelm(t, set("mps.enabled", true))
	var plain objects
	data, err := os.ReadFile("kubernetes/mps/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range splitDocs(data) {
		decode(t, "mps/daemonset.yaml", doc, &plain)
	}
	if diff := cmp.Diff(plain.mpsDaemonSet, chart.mpsDaemonSet, withoutHelmMetadata()); diff != "" {
		t.Errorf("the chart's MPS DaemonSet differs from deploy/kubernetes/mps (-plain +chart):\n%s", diff)
	}
	moved, _ := renderHelm(t, set("mps.enabled", true, "hostRootHostPath", "/run/nvidia/driver", "driverRootHostPath", "/run/nvidia/driver"))
	for _, v := range moved.mpsDaemonSet.Spec.Template.Spec.Volumes {
		if strings.HasPrefix(v.Name, "host-") || v.Name == "driver-root" {
			if !strings.HasPrefix(v.HostPath.Path, "/run/nvidia/driver") {
				t.Errorf("volume %s: host path %s, not under hostRootHostPath/driverRootHostPath", v.Name, v.HostPath.Path)
			}
		}
	}
}

// exportedSeries are the series names nri-gpu's /metrics serves: every
// metric family internal/ops/metrics registers, scraped from its handler
// after each of its observers ran once (a vector is empty before), as
// the family's name and, for histograms and summaries, its _bucket, _sum
// and _count series.
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New("test")
	gpus := []inventory.GPU{{Index: 0, UUID: "GPU-a"}}
	m.Inventory(&inventory.Snapshot{DriverVersion: "580.126.09", GPUs: gpus})
	m.Request("env", "injected", gpus, time.Microsecond)
	m.Refresh("changed")
	m.Connected()
	m.SetAllocations(func() []metrics.Allocation { return []metrics.Allocation{{Index: 0, UUID: "GPU-a", Holders: 1}} })
	m.XID(79, true)
	m.Unhealthy(map[string]string{"GPU-a": "XID 79"})
	srv := httptest.NewServer(metrics.Handler(m, func() error { return nil }))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for name, f := range families {
		out[name] = true
		switch f.GetType().String() {
		case "HISTOGRAM":
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		case "SUMMARY":
			out[name+"_sum"], out[name+"_count"] = true, true
		}
	}
	for _, must := range []string{"nri_gpu_requests_total", "nri_gpu_ready", "nri_gpu_device_unhealthy", "nri_gpu_request_duration_seconds_bucket"} {
		if !out[must] {
			t.Fatalf("/metrics has no %s:\n%s", must, body)
		}
	}
	return out
}

// prometheusSeries are the series Prometheus writes itself for each
// target: up (0 when a scrape fails) is how an alert sees a pod that
// does not answer.
var prometheusSeries = map[string]bool{"up": true}

// grafanaVars are Grafana's interval variables, replaced by a duration
// to parse an expression as PromQL; the dashboard's own variables appear
// only inside label matchers' strings.
var grafanaVars = regexp.MustCompile(`\$__(rate_interval|interval|range)\b`)

// promqlMetrics parses expr as PromQL and returns the metric names its
// selectors read.
func promqlMetrics(t *testing.T, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.ReplaceAllString(expr, "5m"))
	if err != nil {
		t.Errorf("%q: %v", expr, err)
		return nil
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if v, ok := n.(*parser.VectorSelector); ok {
			names = append(names, v.Name)
			if v.Name == "" {
				t.Errorf("%q: a selector without a metric name", expr)
			}
		}
		return nil
	})
	if len(names) == 0 {
		t.Errorf("%q reads no metric", expr)
	}
	return names
}

// dashboardQueries are the PromQL expressions of a Grafana dashboard:
// every panel's (rows' panels included) targets' expr, and the query
// variables' label_values(selector, label) selectors.
func dashboardQueries(t *testing.T, data []byte) (panels, variables []string) {
	t.Helper()
	var d struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatal(err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable query %q: want label_values(selector, label)", q.Query)
			continue
		}
		variables = append(variables, m[1])
	}
	return exprs, variables
}

type dashPanel struct {
	Title   string      `json:"title"`
	Panels  []dashPanel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// TestDashboardMetrics: every query of the Grafana dashboard parses as
// PromQL and reads only series nri-gpu exports (or up), each selected by
// the job the monitors set, and the chart's ConfigMap ships the file as
// it is, labelled for Grafana's sidecar.
func TestDashboardMetrics(t *testing.T) {
	exported := exportedSeries(t)
	data, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "nri-gpu.json"))
	if err != nil {
		t.Fatal(err)
	}
	panels, variables := dashboardQueries(t, data)
	if len(panels) < 10 || len(variables) < 2 {
		t.Fatalf("%d panel queries and %d variables in the dashboard", len(panels), len(variables))
	}
	used := map[string]bool{}
	for _, e := range append(panels, variables...) {
		for _, name := range promqlMetrics(t, e) {
			used[name] = true
			if !exported[name] && !prometheusSeries[name] {
				t.Errorf("dashboard query %q reads %s, which nri-gpu does not export", e, name)
			}
		}
	}
	for _, e := range panels {
		if strings.Count(e, `job="$job", node=~"$node"`) != strings.Count(e, "{") {
			t.Errorf("dashboard query %q: every selector must select job=\"$job\" and node=~\"$node\"", e)
		}
	}
	for _, name := range []string{"nri_gpu_requests_total", "nri_gpu_device_unhealthy", "nri_gpu_ready", "nri_gpu_request_duration_seconds_bucket", "nri_gpu_gpu_allocations"} {
		if !used[name] {
			t.Errorf("the dashboard does not show %s", name)
		}
	}

	objs, _ := renderHelm(t, set("metrics.grafanaDashboard.enabled", true))
	cm := objs.dashboard
	if cm.Labels["grafana_dashboard"] != "1" || cm.Namespace != "nri-gpu" || strings.TrimSpace(cm.Data["nri-gpu.json"]) != strings.TrimSpace(string(data)) {
		t.Errorf("dashboard ConfigMap %s/%s labels %v: want grafana_dashboard=1 and dashboards/nri-gpu.json as it is", cm.Namespace, cm.Name, cm.Labels)
	}
}

// TestMonitoring renders the Service, the ServiceMonitor (or PodMonitor),
// the alerts and the NetworkPolicy and checks that they fit together: the
// Service selects nri-gpu's pods on their metrics port, the monitor
// selects the Service (or the pods) and names its job after the chart, the
// rules pass Prometheus's own rule-file checks and read only series nri-gpu
// exports, selecting that job; the NetworkPolicy admits metricsFrom to the
// metrics port and nothing else. Both monitors at once, or a
// ServiceMonitor without the Service, fail at install.
func TestMonitoring(t *testing.T) {
	objs := renderValues(t, values(t, monitoring))
	pod := objs.daemonSet.Spec.Template
	port := pod.Spec.Containers[0].Ports[0]
	svc := objs.service
	if svc.Spec.ClusterIP != "None" || !subset(svc.Spec.Selector, pod.Labels) || len(svc.Spec.Ports) != 1 ||
		svc.Spec.Ports[0].TargetPort != intstr.FromString(port.Name) || svc.Spec.Ports[0].Port != port.ContainerPort {
		t.Errorf("Service %+v does not select the pods' port %+v headless", svc.Spec, port)
	}
	sm := objs.serviceMonitor
	job := svc.Labels[sm.Spec.JobLabel]
	if !subset(sm.Spec.Selector.MatchLabels, svc.Labels) || !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{"nri-gpu"}) ||
		len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name || sm.Spec.Endpoints[0].Path != "/metrics" || job != "nri-gpu" {
		t.Errorf("ServiceMonitor %+v does not scrape Service %v's port (job %q)", sm.Spec, svc.Labels, job)
	}
	if r := sm.Spec.Endpoints[0].RelabelConfigs; len(r) != 1 || r[0].TargetLabel != "node" {
		t.Errorf("relabelings %+v: want the node label the alerts and the dashboard use", r)
	}

	// The rules, as a Prometheus rule file.
	groups, err := yaml.Marshal(map[string]any{"groups": objs.rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if _, errs := rulefmt.Parse(groups, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler)); len(errs) > 0 {
		t.Errorf("Prometheus refuses the rules: %v\n%s", errs, groups)
	}
	exported := exportedSeries(t)
	var alerts []string
	for _, g := range objs.rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			e := r.Expr.String()
			for _, name := range promqlMetrics(t, e) {
				if !exported[name] && !prometheusSeries[name] {
					t.Errorf("alert %s reads %s, which nri-gpu does not export", r.Alert, name)
				}
			}
			if strings.Count(e, `job="`+job+`", namespace="nri-gpu"`) != strings.Count(e, "{") {
				t.Errorf("alert %s: %q: every selector must select job %q in namespace nri-gpu", r.Alert, e, job)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: no severity, summary or description", r.Alert)
			}
		}
	}
	for _, a := range []string{"NRIGPUDown", "NRIGPUDeviceUnhealthy", "NRIGPURequestsRefused"} {
		if !slices.Contains(alerts, a) {
			t.Errorf("no alert %s in %v", a, alerts)
		}
	}

	np := objs.networkPolicy
	if !subset(np.Spec.PodSelector.MatchLabels, pod.Labels) || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{"Ingress"}) ||
		len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || *np.Spec.Ingress[0].Ports[0].Port != intstr.FromString(port.Name) ||
		len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
		t.Errorf("NetworkPolicy %+v: want ingress to port %s from metricsFrom only", np.Spec, port.Name)
	}
	closed := renderValues(t, values(t, set("networkPolicy.enabled", true))).networkPolicy
	if len(closed.Spec.Ingress) != 0 || !slices.Equal(closed.Spec.PolicyTypes, []networkingv1.PolicyType{"Ingress"}) {
		t.Errorf("NetworkPolicy without metricsFrom %+v: want no ingress at all", closed.Spec)
	}

	pm := renderValues(t, values(t, set("metrics.podMonitor.enabled", true))).podMonitor
	if !subset(pm.Spec.Selector.MatchLabels, pod.Labels) || pm.Spec.JobLabel != "app.kubernetes.io/name" || pod.Labels[pm.Spec.JobLabel] != job ||
		len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port == nil || *pm.Spec.PodMetricsEndpoints[0].Port != port.Name {
		t.Errorf("PodMonitor %+v does not scrape the pods' port %s as job %s", pm.Spec, port.Name, job)
	}

	for set, want := range map[string]string{
		"metrics.podMonitor.enabled=true":                              "turn one on",
		"metrics.service.enabled=false":                                "needs metrics.service.enabled",
		"config.dra.enabled=true,config.devicePlugin.devices[0]=GPU-0": "give both config.devicePlugin.devices and config.dra.devices",
	} {
		_, err := runHelm(t, "template", "nri-gpu", chartDir, "--set", "metrics.serviceMonitor.enabled=true", "--set", set)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v, want an error saying %q", set, err, want)
		}
	}
}
