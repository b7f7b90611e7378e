package suite

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// apiCostOptIn is the env var that runs TestAgentAPICost: the minutes of
// its steady-state window (make bench-agent: 10).
const apiCostOptIn = "NRI_GPU_E2E_API_COST"

// nriGPUUser is the user nri-gpu's DaemonSet calls the API server as:
// its service account.
const nriGPUUser = "system:serviceaccount:nri-gpu:nri-gpu"

// apiCostPolicy audits every request of nri-gpu's service account, and
// only those, at metadata level (verb, resource, URI, user agent).
const apiCostPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["` + nriGPUUser + `"]
- level: None
`

// apiWindow is a span of TestAgentAPICost: what happened in it, and how
// many of its units (claim prepares, health changes) for a per-unit cost.
type apiWindow struct {
	name     string
	from, to time.Time
	units    int
	unit     string
}

// TestAgentAPICost measures one nri-gpu's requests to the real API
// server (its service account's, from the API server's audit log), as
// DRA driver and device plugin on gpu-a (four H100s: DRA on three, the
// device plugin on one): from its install to its slices published; a
// steady state of $NRI_GPU_E2E_API_COST minutes; a restart; a GPU's health
// flap (a critical XID, the GPU lost, then back: three health changes);
// 100 claim prepares. It fails on a list or watch of the whole cluster
// (one without a field selector), on ResourceSlice writes at steady
// state, at the restart or at the prepares (the devices did not change),
// and on more slice writes in the flap than health changes.
func TestAgentAPICost(t *testing.T) {
	minutes, _ := strconv.Atoi(os.Getenv(apiCostOptIn))
	if minutes <= 0 {
		t.Skipf("runs only with %s=<minutes of steady state> (make bench-agent: 10)", apiCostOptIn)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a cluster with real runtimes, kubelets and namespaces (CI runs as root)")
	}
	c := startTestCluster(t, harness.KubernetesVersion, []harness.NodeOptions{harness.GPUNodes()[0]},
		func(o *harness.ClusterOptions) { o.AuditPolicy = apiCostPolicy })
	k := kc{t: t, c: c, ctx: t.Context()}
	n := c.Node("gpu-a")
	k.doc("label", map[string]string{"node": "gpu-a"})
	var ws []apiWindow
	mark := func(name string, from time.Time, units int, unit string) {
		ws = append(ws, apiWindow{name: name, from: from, to: time.Now(), units: units, unit: unit})
	}

	start := time.Now()
	k.run("apply", "-k", draOverlay())
	waitAgent(k)
	time.Sleep(30 * time.Second)
	mark("install, until 30 s after its slices are published", start, 0, "")

	start = time.Now()
	time.Sleep(time.Duration(minutes) * time.Minute)
	mark(fmt.Sprintf("steady state, %d min", minutes), start, 0, "")

	start = time.Now()
	k.doc("restart", nil)
	k.doc("status", nil)
	waitAgent(k)
	time.Sleep(30 * time.Second)
	mark("restart (rollout), until 30 s after Ready", start, 0, "")

	start = time.Now()
	flap(k, n)
	mark("health flap of one DRA GPU: XID 79, lost, back", start, 3, "health change")

	start = time.Now()
	prepares := claimPrepares(k, 100)
	mark("claim pods, 3 at a time", start, prepares, "prepare")

	events, err := harness.ReadAudit(c.AuditLog, nriGPUUser)
	if err != nil {
		t.Fatal(err)
	}
	checkScoped(t, events)
	var report strings.Builder
	report.WriteString("\nits lists and watches: " + strings.Join(listWatchURIs(events), ", ") + "\n")
	for _, w := range ws {
		in := eventsIn(events, w.from, w.to)
		writes := countVerbs(in, "resourceslices", "create", "update", "patch", "delete", "deletecollection")
		fmt.Fprintf(&report, "\n%s: %s, %d requests (%.1f a minute)", w.name, w.to.Sub(w.from).Round(time.Second), len(in), float64(len(in))/w.to.Sub(w.from).Minutes())
		if w.units > 0 {
			fmt.Fprintf(&report, ", %.2f a %s", float64(len(in))/float64(w.units), w.unit)
		}
		fmt.Fprintf(&report, "; ResourceSlice writes %d; latency of the non-watch requests: %s\n%s", writes, latencies(in), byVerb(in))
		fmt.Fprintf(&report, "%s\n", atNodes(in, w.to.Sub(w.from), 5000))
		switch {
		case strings.HasPrefix(w.name, "health"):
			if writes == 0 || writes > w.units {
				t.Errorf("%s: %d ResourceSlice writes for %d health changes: want one per change at most, and some", w.name, writes, w.units)
			}
		case !strings.HasPrefix(w.name, "install") && writes > 0:
			t.Errorf("%s: %d ResourceSlice writes, though the devices did not change", w.name, writes)
		}
	}
	t.Logf("nri-gpu's requests to the API server (user %s, from the audit log):%s", nriGPUUser, report.String())
}

// waitAgent waits for nri-gpu's DaemonSet to be Ready and its DRA
// GPUs published.
func waitAgent(k kc) {
	k.t.Helper()
	if err := k.c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", 1, 3*time.Minute); err != nil {
		k.t.Fatal(err)
	}
	k.wait(time.Minute, "gpu-a's 3 DRA GPUs published", func() (bool, string, error) {
		got, err := sliceDeviceCounts(k)
		return err == nil && got[draDriver+"/gpu-a"] == 3, fmt.Sprint(got, err), nil
	})
}

// flap makes gpu-a's GPU 0 (published by DRA) unhealthy by a critical
// XID, then lost (NVML), then back, waiting each time for its device's
// taint to say so.
func flap(k kc, n *harness.Node) {
	k.t.Helper()
	g := n.GPU.GPUs[0]
	dev := fmt.Sprintf("gpu-%d", g.Minor)
	st := simnode.NVMLState{Events: []simnode.XID{{GPU: 0, XID: 79, GI: -1, CI: -1}}}
	steps := []struct {
		gpus []simnode.NVMLGPU
		want string // taint key, "" for none
	}{{nil, "gpu.nvidia.com/xid"}, {[]simnode.NVMLGPU{{Lost: true}}, "gpu.nvidia.com/gpu-lost"}, {[]simnode.NVMLGPU{{}}, ""}}
	for _, s := range steps {
		st.GPUs = s.gpus
		if err := n.GPU.WriteNVMLState(st); err != nil {
			k.t.Fatal(err)
		}
		k.wait(2*time.Minute, fmt.Sprintf("%s's taint %q", dev, s.want), func() (bool, string, error) {
			got, err := deviceTaint(k, dev)
			return err == nil && got == s.want, fmt.Sprint(got, err), nil
		})
	}
	time.Sleep(10 * time.Second)
}

// deviceTaint is the key of gpu-a's DRA device dev's first taint, "" for
// none.
func deviceTaint(k kc, dev string) (string, error) {
	var list resourceapi.ResourceSliceList
	if err := k.c.GetJSON(k.ctx, &list, "resourceslices"); err != nil {
		return "", err
	}
	for _, s := range list.Items {
		if s.Spec.Driver != draDriver {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name == dev {
				if len(d.Taints) == 0 {
					return "", nil
				}
				return d.Taints[0].Key, nil
			}
		}
	}
	return "", fmt.Errorf("no device %s", dev)
}

// claimPrepares runs claim pods of one GPU on gpu-a, three at a time
// (its DRA GPUs), each Running then deleted, until want claims were
// prepared; it returns how many.
func claimPrepares(k kc, want int) int {
	k.t.Helper()
	k.run("create", "namespace", draNS)
	done := 0
	for batch := 0; done < want; batch++ {
		var names []string
		var yaml []string
		for i := 0; i < 3 && done+len(names) < want; i++ {
			name := fmt.Sprintf("cost-%d-%d", batch, i)
			names = append(names, name)
			yaml = append(yaml, claimPod(name, 1, ""))
		}
		k.apply(strings.Join(yaml, "---\n"))
		for _, name := range names {
			if _, err := k.c.WaitPodRunning(k.ctx, draNS, name, 2*time.Minute); err != nil {
				k.t.Fatal(err)
			}
		}
		k.run(append([]string{"delete", "pod", "-n", draNS, "--wait=true", "--timeout=2m"}, names...)...)
		done += len(names)
	}
	time.Sleep(10 * time.Second)
	return done
}

// eventsIn are the requests of events received in [from, to).
func eventsIn(events []harness.AuditEvent, from, to time.Time) []harness.AuditEvent {
	var out []harness.AuditEvent
	for _, e := range events {
		if e.Request() && !e.Received.Before(from) && e.Received.Before(to) {
			out = append(out, e)
		}
	}
	return out
}

// countVerbs counts the requests of events on resource with one of verbs.
func countVerbs(events []harness.AuditEvent, resource string, verbs ...string) int {
	n := 0
	for _, e := range events {
		if e.Resource() == resource && slices.Contains(verbs, e.Verb) {
			n++
		}
	}
	return n
}

// byVerb is a Markdown table of events by verb and resource.
func byVerb(events []harness.AuditEvent) string {
	counts := map[string]int{}
	for _, e := range events {
		counts[e.Verb+" "+e.Resource()]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("| verb resource | requests |\n| --- | --- |\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %d |\n", k, counts[k])
	}
	return b.String()
}

// The API server's default limits on requests in flight
// (--max-requests-inflight, --max-mutating-requests-inflight); watches,
// long-running, are not counted against them.
const (
	defaultReadInflight   = 400
	defaultMutateInflight = 200
)

// atNodes extrapolates events, one agent's requests over d, to nodes
// agents doing the same in the same span: their rate, and by Little's law
// (rate times mean latency) the requests in flight they hold, read-only
// and mutating, against the default limits; and the watches they hold
// open.
func atNodes(events []harness.AuditEvent, d time.Duration, nodes int) string {
	var read, mutate, watches int
	var readLat, mutateLat time.Duration
	for _, e := range events {
		lat := e.StageAt.Sub(e.Received)
		switch e.Verb {
		case "watch":
			watches++
		case "get", "list":
			read++
			readLat += lat
		default:
			mutate++
			mutateLat += lat
		}
	}
	// n requests a node over d, lat their summed latency: nodes*n/d a
	// second, each lat/n long, so nodes*lat/d in flight.
	inflight := func(lat time.Duration) float64 { return float64(nodes) * lat.Seconds() / d.Seconds() }
	return fmt.Sprintf("at %d nodes doing the same at once: %.1f requests a second besides watches (%.1f mutating), %.2f read-only in flight of %d, %.2f mutating of %d; %d watches opened",
		nodes, float64(nodes*(read+mutate))/d.Seconds(), float64(nodes*mutate)/d.Seconds(),
		inflight(readLat), defaultReadInflight, inflight(mutateLat), defaultMutateInflight, nodes*watches)
}

// latencies are the mean and the largest time the API server took to
// answer the non-watch requests of events.
func latencies(events []harness.AuditEvent) string {
	var sum, top time.Duration
	n := 0
	for _, e := range events {
		if e.Verb == "watch" {
			continue
		}
		d := e.StageAt.Sub(e.Received)
		sum += d
		top = max(top, d)
		n++
	}
	if n == 0 {
		return "none"
	}
	return fmt.Sprintf("mean %s, max %s", (sum / time.Duration(n)).Round(10*time.Microsecond), top.Round(10*time.Microsecond))
}

// listWatchURIs are the distinct paths and selectors of the lists and
// watches of events.
func listWatchURIs(events []harness.AuditEvent) []string {
	seen := map[string]bool{}
	var out []string
	for _, e := range events {
		if e.Verb != "list" && e.Verb != "watch" {
			continue
		}
		path, query, _ := strings.Cut(e.RequestURI, "?")
		var keep []string
		for _, kv := range strings.Split(query, "&") {
			if strings.HasPrefix(kv, "fieldSelector=") || strings.HasPrefix(kv, "labelSelector=") {
				keep = append(keep, kv)
			}
		}
		u := e.Verb + " " + path
		if len(keep) > 0 {
			u += "?" + strings.Join(keep, "&")
		}
		if !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	sort.Strings(out)
	return out
}

// checkScoped fails on a list or watch of a cluster-scoped resource
// without a field selector (every object of the cluster), and on one of
// a namespaced resource across namespaces without one.
func checkScoped(t *testing.T, events []harness.AuditEvent) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range events {
		if e.Verb != "list" && e.Verb != "watch" {
			continue
		}
		if strings.Contains(e.RequestURI, "fieldSelector=") || e.ObjectRef != nil && e.ObjectRef.Namespace != "" {
			continue
		}
		if !seen[e.RequestURI] {
			seen[e.RequestURI] = true
			t.Errorf("nri-gpu %s %s: the whole cluster's %s, no field selector (user agent %s)", e.Verb, e.RequestURI, e.Resource(), e.UserAgent)
		}
	}
}
