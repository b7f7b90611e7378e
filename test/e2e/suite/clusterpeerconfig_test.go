package suite

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// gpuConfigRow is one opaque configuration of the claim table: params
// (a configuration's JSON, "%s" standing for GpuConfig's apiVersion)
// applied to a whole GPU, or to a MIG device; nvidia is what NVIDIA's
// driver does with it, as its API types and their validation say (v0.5.0,
// api/nvidia.com/resource/v1beta1: the strict decoder, Normalize,
// Validate; the prepare's config checks of cmd/gpu-kubelet-plugin: a
// configuration of another kind than the device's is skipped, the
// sharing settings of the other strategy refused; with its
// TimeSlicingSettings and MPSSupport gates on).
type gpuConfigRow struct {
	name   string
	params string
	mig    bool
	nvidia bool // accepted
}

// gpuConfigAPI is GpuConfig's apiVersion.
const gpuConfigAPI = "resource.nvidia.com/v1beta1"

// gpuConfigRows are the claim table's rows. "Accepted" is what the
// drivers' validation says: a claim whose device then cannot be shared
// here (NVIDIA's MPS control daemon is a Deployment of NVIDIA's image;
// nri-gpu's comes from nri-gpu mps, not installed here) counts as
// accepted when the failure is not the configuration's.
var gpuConfigRows = []gpuConfigRow{
	{"no sharing", `{"apiVersion":"%s","kind":"GpuConfig"}`, false, true},
	{"TimeSlicing", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`, false, true},
	{"TimeSlicing interval Default", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Default"}}}`, false, true},
	{"TimeSlicing interval Long", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`, false, true},
	{"TimeSlicing interval Longest", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Longest"}}}`, false, false},
	{"TimeSlicing with mpsConfig", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","mpsConfig":{"defaultActiveThreadPercentage":50}}}`, false, false},
	{"strategy Spatial", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"Spatial"}}`, false, false},
	{"strategy timeslicing (lower case)", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"timeslicing"}}`, false, false},
	{"MPS 50 %, 10Gi (the quickstart's)", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}}}`, false, true},
	{"MPS 150 %", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":150}}}`, false, false},
	{"MPS 0 %", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":0}}}`, false, true},
	{"MPS -1 %", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":-1}}}`, false, false},
	{"MPS multiUser", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"multiUser":true}}}`, false, true},
	{"MPS with timeSlicingConfig", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"MPS","timeSlicingConfig":{"interval":"Default"}}}`, false, false},
	{"MPS per-device limit of device 0", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{"0":"5Gi"}}}}`, false, true},
	{"MPS per-device limit of device 1 (the claim has one)", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{"1":"5Gi"}}}}`, false, false},
	{"unknown field sharing.spatialConfig", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","spatialConfig":{}}}`, false, false},
	{"field Sharing (upper case)", `{"apiVersion":"%s","kind":"GpuConfig","Sharing":{"strategy":"TimeSlicing"}}`, false, false},
	{"field sharing twice", `{"apiVersion":"%s","kind":"GpuConfig","sharing":{"strategy":"Spatial"},"sharing":{"strategy":"TimeSlicing"}}`, false, false},
	{"apiVersion v1alpha1", `{"apiVersion":"resource.nvidia.com/v1alpha1","kind":"GpuConfig"}`, false, false},
	{"no apiVersion", `{"kind":"GpuConfig"}`, false, false},
	{"kind MigDeviceConfig on a GPU", `{"apiVersion":"%s","kind":"MigDeviceConfig"}`, false, true},
	{"kind MigDeviceConfig on a MIG device", `{"apiVersion":"%s","kind":"MigDeviceConfig"}`, true, true},
	{"GpuConfig on a MIG device", `{"apiVersion":"%s","kind":"GpuConfig"}`, true, true},
}

// refusedRE matches a kubelet's FailedPrepareDynamicResources message
// that refuses the claim's configuration, per driver: NVIDIA's decode,
// normalize, validate and type errors (device_state.go), nri-gpu's
// errors naming the field.
var refusedRE = map[string]*regexp.Regexp{
	nvidiaDriver: regexp.MustCompile(`error getting opaque device configs|error normalizing|error validating|cannot apply|cannot use|DefaultPerDevicePinnedMemoryLimit`),
	draDriver:    regexp.MustCompile(`opaque\.parameters`),
}

// configClaim is a ResourceClaim of one device of class (a MIG device of
// class's kind when mig) that sel selects (peerSelector) with the opaque
// configuration params for driver.
func configClaim(name, class, driver, params, sel string, mig bool) string {
	if mig {
		class = strings.Replace(class, "gpu.", "mig.", 1)
	}
	return fmt.Sprintf(`{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":%[1]q,"namespace":"gpuconfig"},
"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":%[2]q,"selectors":[{"cel":{"expression":%[5]q}}]}}],
"config":[{"requests":["gpu"],"opaque":{"driver":%[3]q,"parameters":%[4]s}}]}}}`, name, class, driver, params, sel)
}

// configPod is a pod of the claim name.
func configPod(name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: gpuconfig}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - {name: gpu, resourceClaimName: %[1]s}
  containers:
  - name: main
    image: %[2]s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: gpu}]}
`, name, harness.GlibcImage)
}

// configOutcome waits for the pod name: Running is accepted; a
// FailedPrepareDynamicResources whose message is a refusal of the
// configuration (refusedRE) is refused, another one accepted (the device
// was configured, then could not be shared here); it returns the
// message too. A pod that comes to neither fails the test with what the
// cluster knows of it (podReport).
func configOutcome(k kc, name, driver string) (bool, string) {
	k.t.Helper()
	var accepted bool
	var msg string
	err := harness.WaitFor(k.ctx, 90*time.Second, "pod "+name+" running or refused", func() (bool, string, error) {
		p, err := k.c.GetPod(k.ctx, "gpuconfig", name)
		if err != nil {
			return false, err.Error(), nil
		}
		if p.Status.Phase == corev1.PodRunning {
			accepted, msg = true, "Running"
			return true, "", nil
		}
		evs, err := k.c.Events(k.ctx, "gpuconfig", "involvedObject.name="+name)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, e := range evs {
			if e.Reason == "FailedPrepareDynamicResources" {
				msg = e.Message
				accepted = !refusedRE[driver].MatchString(e.Message)
				return true, "", nil
			}
		}
		return false, string(p.Status.Phase), nil
	})
	if err != nil {
		k.t.Fatalf("%v\n%s", err, podReport(k, "gpuconfig", name))
	}
	return accepted, msg
}

// podReport is what the cluster knows of a pod that did not come to
// what a test waited for: kubectl describe (its conditions, containers'
// states and events), and the lines of its node's kubelet log naming it.
func podReport(k kc, ns, name string) string {
	var b strings.Builder
	out, err := k.c.Kubectl(k.ctx, "describe", "pod", "-n", ns, name)
	fmt.Fprintf(&b, "--- kubectl describe pod %s/%s (%v) ---\n%s\n", ns, name, err, out)
	if p, err := k.c.GetPod(k.ctx, ns, name); err == nil && p.Spec.NodeName != "" {
		if n := k.c.Node(p.Spec.NodeName); n != nil && n.Kubelet != nil {
			lines := n.Kubelet.Grep(regexp.QuoteMeta(ns + "/" + name))
			lines = lines[max(0, len(lines)-40):]
			fmt.Fprintf(&b, "--- node %s: the kubelet's last %d lines naming the pod ---\n%s\n", n.Name, len(lines), strings.Join(lines, "\n"))
		}
	}
	return b.String()
}

// testPeerConfigs puts each gpuConfigRows configuration on a claim of
// NVIDIA's driver and on the same claim of nri-gpu's (its driver and
// class): NVIDIA's driver must do what the row says, and nri-gpu the
// same unless docs/dra.md lists the row as a difference with its
// reason.
func testPeerConfigs(k kc) {
	t := k.t
	known, err := knownRows(repoRoot()+"/docs/dra.md", "### GpuConfig beside NVIDIA's driver")
	if err != nil {
		t.Fatal(err)
	}
	k.run("create", "namespace", "gpuconfig")
	defer k.run("delete", "namespace", "gpuconfig", "--wait=true", "--timeout=3m")
	const batch = 4 // whole GPUs of each driver's half (peerSelector) on peer-h100 and peer-a100: 2 + 2
	seen := map[string]bool{}
	for start := 0; start < len(gpuConfigRows); start += batch {
		rows := gpuConfigRows[start:min(start+batch, len(gpuConfigRows))]
		var pods []string
		for i, r := range rows {
			for _, d := range []struct{ driver, class, suffix string }{{nvidiaDriver, "gpu.nvidia.com", "nv"}, {draDriver, "gpu.nri-gpu.dev", "ng"}} {
				name := fmt.Sprintf("cfg-%d-%s", start+i, d.suffix)
				params := r.params
				if strings.Contains(params, "%s") {
					params = fmt.Sprintf(params, gpuConfigAPI)
				}
				// The claim goes in as written (kubectl create --raw):
				// kubectl apply would decode it, dropping a repeated field.
				if _, err := k.c.KubectlStdin(k.ctx, configClaim(name, d.class, d.driver, params, peerSelector(k.c, d.driver), r.mig),
					"create", "--raw", "/apis/resource.k8s.io/v1/namespaces/gpuconfig/resourceclaims", "-f", "-"); err != nil {
					t.Fatal(err)
				}
				k.apply(configPod(name))
				pods = append(pods, name)
			}
		}
		for i, r := range rows {
			nvOK, nvMsg := configOutcome(k, fmt.Sprintf("cfg-%d-nv", start+i), nvidiaDriver)
			ngOK, ngMsg := configOutcome(k, fmt.Sprintf("cfg-%d-ng", start+i), draDriver)
			word := map[bool]string{true: "accepted", false: "refused"}
			t.Logf("%-52s NVIDIA's driver %s (%s); nri-gpu %s (%s)", r.name, word[nvOK], shorten(nvMsg), word[ngOK], shorten(ngMsg))
			if nvOK != r.nvidia {
				t.Errorf("%s: NVIDIA's driver %s it, its validation %s it: %s", r.name, word[nvOK], word[r.nvidia], nvMsg)
			}
			_, listed := known[r.name]
			switch {
			case ngOK != nvOK && !listed:
				t.Errorf("%s: nri-gpu %s it, NVIDIA's driver %s it, and docs/dra.md does not list the difference: %s", r.name, word[ngOK], word[nvOK], ngMsg)
			case ngOK == nvOK && listed:
				t.Errorf("%s: docs/dra.md lists a difference, but both %s it", r.name, word[ngOK])
			}
			seen[r.name] = true
		}
		k.run(append([]string{"delete", "pod", "-n", "gpuconfig", "--wait=true", "--timeout=2m"}, pods...)...)
		k.run(append([]string{"delete", "resourceclaim", "-n", "gpuconfig", "--wait=true", "--timeout=2m"}, pods...)...)
	}
	for name := range known {
		if !seen[name] {
			t.Errorf("docs/dra.md lists a GpuConfig row the table has not: %s", name)
		}
	}
}

// shorten cuts a message to its last 160 bytes (the driver's own words
// come last in the kubelet's).
func shorten(s string) string {
	if len(s) > 160 {
		return "..." + s[len(s)-160:]
	}
	return s
}
