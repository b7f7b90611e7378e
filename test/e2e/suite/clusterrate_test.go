package suite

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// nodeRateOptIn is the env var that runs TestNodeRate: its minutes of
// pod starts (make bench-agent: 10). nodeRatePodsEnv is the pod starts a
// second (default 1; several, "2 3 4", run one after the other on the
// same node, each for the minutes: a probe for the highest sustained),
// nodeRateLifeEnv each pod's life in seconds (default 20).
const (
	nodeRateOptIn   = "NRI_GPU_E2E_NODE_RATE"
	nodeRatePodsEnv = "NRI_GPU_E2E_NODE_RATE_PODS"
	nodeRateLifeEnv = "NRI_GPU_E2E_NODE_RATE_LIFE"
	rateNS          = "rate"
	migResource     = "nvidia.com/mig-1g.10gb"
)

// Kinds of the rate bench's pods, in turn: a claim of one MIG device
// through nri-gpu's DRA driver, a pod without GPU, a MIG device through
// nri-gpu's device plugin, a pod without GPU.
const (
	kindClaim = "MIG claim (DRA)"
	kindPlain = "no GPU"
	kindDP    = "nvidia.com/mig-1g.10gb (device plugin)"
)

var rateKinds = []string{kindClaim, kindPlain, kindDP, kindPlain}

// rateLabel is each kind's pod label value (a label value has no "/").
var rateLabel = map[string]string{kindClaim: "claim", kindPlain: "plain", kindDP: "device-plugin"}

// rateNode is gpu-a with 8 H100s, each in seven 1g.10gb MIG devices (56).
func rateNode() harness.NodeOptions {
	return harness.NodeOptions{Name: "gpu-a", Runtime: harness.RuntimeContainerd24, GPUs: &simnode.Options{NumGPUs: 8, Layout: simnode.LayoutRHEL},
		Prepare: func(n *harness.Node, _ *harness.NodeOptions) error { return n.GPU.SetMIG(rateLayout()) }}
}

func rateLayout() simnode.NVMLState {
	var st simnode.NVMLState
	for range 8 {
		g := simnode.NVMLGPU{MIGMode: 1}
		for gi := 7; gi <= 13; gi++ {
			g.MIG = append(g.MIG, simnode.H100MIG(gi, 0, 1))
		}
		st.GPUs = append(st.GPUs, g)
	}
	return st
}

// ratePod is one pod of the stream.
type ratePod struct {
	name, kind     string
	created        time.Time
	uid, claim     string
	running        time.Time
	view           string // what its container printed
	wantMIG        string // the MIG device it was given (UUID)
	checked, wrong bool
}

// TestNodeRate drives one real node (containerd 2.4, the kubelet, nri-gpu
// as DRA driver on 42 MIG devices and device plugin on 14) with a stream
// of pod starts at $NRI_GPU_E2E_NODE_RATE_PODS a second for
// $NRI_GPU_E2E_NODE_RATE minutes, half of them GPU pods (a MIG claim, a
// MIG device of the device plugin, in turn), half without GPU, each
// deleted after $NRI_GPU_E2E_NODE_RATE_LIFE seconds. It reports creation
// to Running by kind (p50, p99) and by third of the stream with the
// backlog (whether the rate was sustained), nri-gpu's PrepareResourceClaims
// and CreateContainer times (its log; its histogram), its CPU and RSS; and
// fails on
// any container that sees other devices than it was given (its device
// nodes and NVIDIA_VISIBLE_DEVICES, from its log).
func TestNodeRate(t *testing.T) {
	minutes, _ := strconv.ParseFloat(os.Getenv(nodeRateOptIn), 64)
	if minutes <= 0 {
		t.Skipf("runs only with %s=<minutes> (make bench-agent: 10)", nodeRateOptIn)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a cluster with real runtimes, kubelets and namespaces (CI runs as root)")
	}
	rates := []float64{1}
	if v := strings.Fields(os.Getenv(nodeRatePodsEnv)); len(v) > 0 {
		rates = nil
		for _, f := range v {
			r, err := strconv.ParseFloat(f, 64)
			if err != nil || r <= 0 {
				t.Fatalf("%s=%q: %q is not a positive number", nodeRatePodsEnv, os.Getenv(nodeRatePodsEnv), f)
			}
			rates = append(rates, r)
		}
	}
	life := time.Duration(envFloat(t, nodeRateLifeEnv, 20) * float64(time.Second))
	c := startTestCluster(t, harness.KubernetesVersion, []harness.NodeOptions{rateNode()})
	k := kc{t: t, c: c, ctx: t.Context()}
	n := c.Node("gpu-a")
	k.doc("label", map[string]string{"node": "gpu-a"})
	k.run("apply", "-k", filepath.Join(repoRoot(), "test", "e2e", "cluster", "dra-mig"))
	if err := c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", 1, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	migByDevice := rateSlice(k)
	k.wait(time.Minute, "gpu-a allocatable "+migResource+" = 14", func() (bool, string, error) {
		node, err := c.GetNode(k.ctx, "gpu-a")
		if err != nil {
			return false, err.Error(), nil
		}
		q := node.Status.Allocatable[corev1.ResourceName(migResource)]
		return q.String() == "14", q.String(), nil
	})
	k.run("create", "namespace", rateNS)
	k.apply(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mig, namespace: ` + rateNS + `}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nri-gpu.dev
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}
`)
	cfg, err := c.RESTConfig(100, 200)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cg := nriGPUContainerCgroup(k)
	for step, rate := range rates {
		before := nriGPUMetrics(k)
		cpu0, t0 := cgroupCPU(cg), time.Now()
		load0 := loadAvg()
		s := &rateStream{k: k, cs: cs, n: n, migByDevice: migByDevice, life: life, pods: map[string]*ratePod{}, prefix: fmt.Sprintf("r%d", step)}
		rss := s.run(time.Duration(minutes*float64(time.Minute)), rate, cg)
		wall := time.Since(t0)
		cpu := cgroupCPU(cg) - cpu0
		after := nriGPUMetrics(k)
		s.report(t, rate, wall, cpu, rss, load0, before, after, t0)
	}
}

func envFloat(t *testing.T, name string, def float64) float64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		t.Fatalf("%s=%q: not a positive number", name, v)
	}
	return f
}

// rateSlice waits for gpu-a's 42 DRA MIG devices and returns their UUIDs
// by device name.
func rateSlice(k kc) map[string]string {
	k.t.Helper()
	out := map[string]string{}
	k.wait(2*time.Minute, "gpu-a's 42 DRA MIG devices published", func() (bool, string, error) {
		var list resourceapi.ResourceSliceList
		if err := k.c.GetJSON(k.ctx, &list, "resourceslices"); err != nil {
			return false, err.Error(), nil
		}
		clear(out)
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				if a, ok := d.Attributes["gpu.nvidia.com/uuid"]; ok && s.Spec.Driver == draDriver && a.StringValue != nil {
					out[d.Name] = *a.StringValue
				}
			}
		}
		return len(out) == 42, fmt.Sprintf("%d devices", len(out)), nil
	})
	return out
}

// rateStream creates, watches, checks and deletes the stream's pods.
type rateStream struct {
	k           kc
	cs          kubernetes.Interface
	n           *harness.Node
	migByDevice map[string]string
	life        time.Duration
	mu          sync.Mutex
	pods        map[string]*ratePod
	claims      map[string]string // claim name -> allocated device
	errs        []string
	// start is when the stream began; backlog, sampled every 5 s, the
	// pods created and not yet Running then.
	start   time.Time
	backlog []int
	// prefix starts the stream's pod names (a stream of its own each
	// rate).
	prefix string
}

// run streams pods for d at rate a second; it returns nri-gpu's peak RSS
// (sampled every 5 s) and last RSS, in bytes.
func (s *rateStream) run(d time.Duration, rate float64, cg string) [2]int64 {
	ctx, cancel := context.WithCancel(s.k.ctx)
	defer cancel()
	s.claims = map[string]string{}
	go s.watchPods(ctx)
	go s.watchClaims(ctx)
	var rss [2]int64
	sample := time.NewTicker(5 * time.Second)
	defer sample.Stop()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	end := time.After(d)
	s.start = time.Now()
	var wg sync.WaitGroup
	for i := 0; ; i++ {
		select {
		case <-end:
			wg.Wait()
			s.drain(ctx)
			return rss
		case <-sample.C:
			r := cgroupRSS(cg)
			rss[0], rss[1] = max(rss[0], r), r
			s.sampleBacklog()
			i--
			continue
		case <-tick.C:
		}
		p := &ratePod{name: fmt.Sprintf("%s-%05d", s.prefix, i), kind: rateKinds[i%len(rateKinds)]}
		s.mu.Lock()
		s.pods[p.name] = p
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.one(ctx, p)
		}()
	}
}

// one creates p, waits for it to run, checks what its container sees
// once it printed it, and deletes it after its life.
func (s *rateStream) one(ctx context.Context, p *ratePod) {
	s.mu.Lock()
	p.created = time.Now()
	s.mu.Unlock()
	if _, err := s.cs.CoreV1().Pods(rateNS).Create(ctx, ratePodSpec(p), metav1.CreateOptions{}); err != nil {
		s.fail("pod %s: create: %v", p.name, err)
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(s.life):
	}
	s.check(p)
	zero := int64(0)
	if err := s.cs.CoreV1().Pods(rateNS).Delete(context.WithoutCancel(ctx), p.name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		s.fail("pod %s: delete: %v", p.name, err)
	}
}

// sampleBacklog records how many pods are created and not yet Running.
func (s *rateStream) sampleBacklog() {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.pods {
		if !p.created.IsZero() && p.running.IsZero() {
			n++
		}
	}
	s.backlog = append(s.backlog, n)
}

func (s *rateStream) fail(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, fmt.Sprintf(format, args...))
}

// ratePodSpec is p's pod: its container prints its NVIDIA_VISIBLE_DEVICES
// and device nodes, then sleeps.
func ratePodSpec(p *ratePod) *corev1.Pod {
	zero := int64(0)
	ctr := corev1.Container{Name: "main", Image: harness.GlibcCUDAImage, ImagePullPolicy: corev1.PullNever,
		Command: []string{"sh", "-c", `echo "NVD=$NVIDIA_VISIBLE_DEVICES"; ls /dev; echo CAPS; ls /dev/nvidia-caps 2>/dev/null; echo END; exec sleep 3600`}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: rateNS, Labels: map[string]string{"kind": rateLabel[p.kind]}},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &zero, RestartPolicy: corev1.RestartPolicyNever, NodeSelector: map[string]string{"kubernetes.io/hostname": "gpu-a"}}}
	switch p.kind {
	case kindClaim:
		tmpl := "mig"
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "mig", ResourceClaimTemplateName: &tmpl}}
		ctr.Resources.Claims = []corev1.ResourceClaim{{Name: "mig"}}
	case kindDP:
		ctr.Resources.Limits = corev1.ResourceList{corev1.ResourceName(migResource): resource.MustParse("1")}
	}
	pod.Spec.Containers = []corev1.Container{ctr}
	return pod
}

// watchPods records when each pod is first seen Running, its UID and its
// claim's name.
func (s *rateStream) watchPods(ctx context.Context) {
	w, err := s.cs.CoreV1().Pods(rateNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		s.fail("watch pods: %v", err)
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			continue
		}
		now := time.Now()
		s.mu.Lock()
		if rp := s.pods[p.Name]; rp != nil {
			rp.uid = string(p.UID)
			for _, st := range p.Status.ResourceClaimStatuses {
				if st.ResourceClaimName != nil {
					rp.claim = *st.ResourceClaimName
				}
			}
			if rp.running.IsZero() && p.Status.Phase == corev1.PodRunning {
				rp.running = now
			}
		}
		s.mu.Unlock()
	}
}

// watchClaims records the device each claim of the namespace is
// allocated.
func (s *rateStream) watchClaims(ctx context.Context) {
	w, err := s.cs.ResourceV1().ResourceClaims(rateNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		s.fail("watch claims: %v", err)
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		c, ok := ev.Object.(*resourceapi.ResourceClaim)
		if !ok || c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) == 0 {
			continue
		}
		s.mu.Lock()
		s.claims[c.Name] = c.Status.Allocation.Devices.Results[0].Device
		s.mu.Unlock()
	}
}

// check reads what p's container printed (its log on the node) and
// compares it with what p was given: no GPU; the MIG device its claim
// was allocated; the MIG device the kubelet assigned it from the device
// plugin.
func (s *rateStream) check(p *ratePod) {
	var uid, claim, dev, view string
	var err error
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		s.mu.Lock()
		var running bool
		uid, claim, running = p.uid, p.claim, !p.running.IsZero()
		dev = s.claims[claim]
		s.mu.Unlock()
		if running {
			if view, err = containerLog(s.n, uid, p.name); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			s.fail("pod %s (%s): not Running with its view printed 2 min after its life of %s: running %v, %v", p.name, p.kind, s.life, running, err)
			return
		}
	}
	var want string
	switch p.kind {
	case kindClaim:
		want = s.migByDevice[dev]
		if want == "" {
			s.fail("pod %s: claim %s allocated %q, not one of gpu-a's DRA MIG devices", p.name, claim, dev)
			return
		}
	case kindDP:
		cp, err := harness.ReadDeviceCheckpointAt(s.n.HostPath(harness.KubeletCheckpoint))
		if err != nil {
			s.fail("pod %s: %v", p.name, err)
			return
		}
		for _, e := range cp.Entries {
			if e.PodUID == uid && e.ResourceName == migResource && len(e.DeviceIDs) == 1 {
				want = e.DeviceIDs[0]
			}
		}
		if want == "" {
			s.fail("pod %s: the kubelet's checkpoint has no %s for it", p.name, migResource)
			return
		}
	}
	problem := seesExactly(s.n.GPU, view, want)
	s.mu.Lock()
	p.view, p.wantMIG, p.checked, p.wrong = view, want, true, problem != ""
	s.mu.Unlock()
	if problem != "" {
		s.fail("pod %s (%s): %s", p.name, p.kind, problem)
	}
}

// containerLog is what the container main of the pod printed up to END,
// read from the node's pod log directory.
func containerLog(n *harness.Node, uid, name string) (string, error) {
	path := n.HostPath(filepath.Join("/var/log/pods", rateNS+"_"+name+"_"+uid, "main", "0.log"))
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("its log: %w", err)
	}
	defer f.Close()
	var b strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// CRI log lines: time stream tag message.
		f := strings.SplitN(sc.Text(), " ", 4)
		if len(f) < 4 {
			continue
		}
		if f[3] == "END" {
			return b.String(), nil
		}
		b.WriteString(f[3] + "\n")
	}
	return "", fmt.Errorf("its log %s has no END line yet", path)
}

var gpuNodeRE = regexp.MustCompile(`^nvidia\d+$`)

// seesExactly returns what is wrong with a container's view (NVD=, ls
// /dev, CAPS, ls /dev/nvidia-caps) for the MIG device mig ("" for none):
// its NVIDIA_VISIBLE_DEVICES, its parent's /dev/nvidia<minor> and its
// GPU and compute instances' nvidia-caps nodes and nothing else; none of
// them without a device. "" when nothing is.
func seesExactly(node *simnode.Node, view, mig string) string {
	var gpus, caps []string
	visible := ""
	inCaps := false
	for _, l := range strings.Split(view, "\n") {
		switch {
		case strings.HasPrefix(l, "NVD="):
			visible = strings.TrimPrefix(l, "NVD=")
		case l == "CAPS":
			inCaps = true
		case inCaps && l != "":
			caps = append(caps, l)
		case gpuNodeRE.MatchString(l):
			gpus = append(gpus, "/dev/"+l)
		}
	}
	if mig == "" {
		if len(gpus) > 0 || len(caps) > 0 {
			return fmt.Sprintf("without a GPU it sees GPU nodes %v, nvidia-caps %v", gpus, caps)
		}
		return ""
	}
	for _, g := range node.GPUs {
		for gi := 7; gi <= 13; gi++ {
			if simnode.MIGUUIDFor(g.UUID, gi, 0) != mig {
				continue
			}
			wantCaps := []string{fmt.Sprintf("nvidia-cap%d", simnode.GIMinor(g.Minor, gi)), fmt.Sprintf("nvidia-cap%d", simnode.CIMinor(g.Minor, gi, 0))}
			sort.Strings(wantCaps)
			sort.Strings(caps)
			if visible != mig || !slices.Equal(gpus, []string{fmt.Sprintf("/dev/nvidia%d", g.Minor)}) || !slices.Equal(caps, wantCaps) {
				return fmt.Sprintf("given %s: sees NVIDIA_VISIBLE_DEVICES %q, GPU nodes %v, nvidia-caps %v; want %s, [/dev/nvidia%d], %v",
					mig, visible, gpus, caps, mig, g.Minor, wantCaps)
			}
			return ""
		}
	}
	return fmt.Sprintf("given %s, which is none of gpu-a's MIG devices", mig)
}

// drain waits up to a minute for the stream's deleted pods to be gone.
func (s *rateStream) drain(ctx context.Context) {
	_ = harness.WaitFor(ctx, time.Minute, "the stream's pods gone", func() (bool, string, error) {
		l, err := s.cs.CoreV1().Pods(rateNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return len(l.Items) == 0, fmt.Sprintf("%d left", len(l.Items)), nil
	})
}

// report logs the stream's figures and fails on its errors.
func (s *rateStream) report(t *testing.T, rate float64, wall, cpu time.Duration, rss [2]int64, load0 string, before, after map[string]float64, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byKind := map[string][]time.Duration{}
	checked, wrong, notRunning := map[string]int{}, 0, 0
	for _, p := range s.pods {
		if p.running.IsZero() {
			notRunning++
			continue
		}
		byKind[p.kind] = append(byKind[p.kind], p.running.Sub(p.created))
		if p.checked {
			checked[p.kind]++
		}
		if p.wrong {
			wrong++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d pods in %s at %.2f a second, each %s (load average %s before, %s after); %d never Running\n",
		len(s.pods), wall.Round(time.Second), rate, s.life, load0, loadAvg(), notRunning)
	b.WriteString("| pods | started | checked | creation to Running p50 | p99 |\n| --- | --- | --- | --- | --- |\n")
	kinds := []string{kindPlain, kindClaim, kindDP}
	for _, kind := range kinds {
		d := byKind[kind]
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s |\n", kind, len(d), checked[kind], ms(pct(d, 0.5)), ms(pct(d, 0.99)))
	}
	b.WriteString(s.sustained(rate))
	log := nriGPULog(s.k, since)
	prep := logTimes(log, tookRE)
	fmt.Fprintf(&b, "nri-gpu PrepareResourceClaims (its log, %d claims): p50 %s, p99 %s\n", len(prep), ms(pct(prep, 0.5)), ms(pct(prep, 0.99)))
	count := after["count"] - before["count"]
	fmt.Fprintf(&b, "nri-gpu CreateContainer (nri_gpu_request_duration_seconds, %d requests): p50 %s, p99 %s (histogram buckets, interpolated)\n",
		int(count), histQuantile(before, after, 0.5), histQuantile(before, after, 0.99))
	inj := logTimes(log, injectedRE)
	fmt.Fprintf(&b, "nri-gpu CreateContainer of the GPU containers (its log's took=, %d requests): p50 %s, p99 %s, max %s\n",
		len(inj), us(pct(inj, 0.5)), us(pct(inj, 0.99)), us(pct(inj, 1)))
	fmt.Fprintf(&b, "nri-gpu CPU %.1f%% of one core (%s in %s); RSS peak %.1f MiB, at the end %.1f MiB; wrong answers: %d",
		100*cpu.Seconds()/wall.Seconds(), cpu.Round(time.Millisecond), wall.Round(time.Second), float64(rss[0])/(1<<20), float64(rss[1])/(1<<20), wrong)
	t.Logf("node rate:\n%s", b.String())
	for i, e := range s.errs {
		if i == 20 {
			t.Errorf("... and %d more", len(s.errs)-20)
			break
		}
		t.Error(e)
	}
}

func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	i := int(math.Ceil(q*float64(len(d)))) - 1
	return d[min(max(i, 0), len(d)-1)]
}

func ms(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }

func us(d time.Duration) string { return d.Round(time.Microsecond).String() }

// tookRE and injectedRE find the times nri-gpu logs for a claim's
// prepare ("DRA: claim prepared ... took=") and for a CreateContainer it
// answered with devices or a note (an info line of a container, took=;
// logrus sorts the fields, and a value with a µ is quoted).
var (
	tookRE     = regexp.MustCompile(`DRA: claim prepared.*took="?([0-9.]+[µm]?s)`)
	injectedRE = regexp.MustCompile(`level=info msg=.* container=\S+ .*took="?([0-9.]+[µm]?s)`)
)

// nriGPULog is nri-gpu's pod's log since t (whole seconds).
func nriGPULog(k kc, t time.Time) string {
	pods, err := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu")
	if err != nil || len(pods) != 1 {
		k.t.Errorf("nri-gpu's pod: %v (%d)", err, len(pods))
		return ""
	}
	out, err := k.c.Kubectl(k.ctx, "logs", "-n", "nri-gpu", "--since-time", t.UTC().Truncate(time.Second).Format(time.RFC3339), pods[0].Name)
	if err != nil {
		k.t.Errorf("nri-gpu's log: %v", err)
	}
	return out
}

// logTimes are the times of re's matches in log.
func logTimes(log string, re *regexp.Regexp) []time.Duration {
	var d []time.Duration
	for _, m := range re.FindAllStringSubmatch(log, -1) {
		if v, err := time.ParseDuration(m[1]); err == nil {
			d = append(d, v)
		}
	}
	return d
}

// nriGPUMetrics are nri-gpu's CreateContainer histogram from its metrics
// endpoint (through the API server's pod proxy): "le=<bound>" cumulative
// counts, "count", "sum".
func nriGPUMetrics(k kc) map[string]float64 {
	pods, err := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu")
	if err != nil || len(pods) != 1 {
		k.t.Fatalf("nri-gpu's pod: %v (%d)", err, len(pods))
	}
	out, err := k.c.Kubectl(k.ctx, "get", "--raw", "/api/v1/namespaces/nri-gpu/pods/"+pods[0].Name+":9400/proxy/metrics")
	if err != nil {
		k.t.Fatalf("nri-gpu's metrics: %v", err)
	}
	m := map[string]float64{}
	for _, l := range strings.Split(out, "\n") {
		name, val, ok := strings.Cut(l, " ")
		if !ok || !strings.HasPrefix(name, "nri_gpu_request_duration_seconds") {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "nri_gpu_request_duration_seconds_bucket{le=\""):
			m["le="+strings.TrimSuffix(strings.TrimPrefix(name, "nri_gpu_request_duration_seconds_bucket{le=\""), "\"}")] = v
		case name == "nri_gpu_request_duration_seconds_count":
			m["count"] = v
		case name == "nri_gpu_request_duration_seconds_sum":
			m["sum"] = v
		}
	}
	return m
}

// histQuantile is the q-quantile of the requests between the two
// snapshots of the histogram, interpolated in its bucket as Prometheus'
// histogram_quantile does.
func histQuantile(before, after map[string]float64, q float64) string {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for key, v := range after {
		le, ok := strings.CutPrefix(key, "le=")
		if !ok {
			continue
		}
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			bound = math.Inf(1)
		}
		bs = append(bs, bucket{bound, v - before[key]})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return "-"
	}
	rank := q * bs[len(bs)-1].n
	lo, below := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return fmt.Sprintf("> %s", time.Duration(lo*float64(time.Second)))
			}
			f := (rank - below) / math.Max(b.n-below, 1)
			return time.Duration((lo + f*(b.le-lo)) * float64(time.Second)).Round(time.Microsecond).String()
		}
		lo, below = b.le, b.n
	}
	return "-"
}

// cgroupCPU is the CPU time of the cgroup v1 cpu directory cg
// (cpuacct.usage; cgroup v2's cpu.stat usage_usec), 0 when unknown.
func cgroupCPU(cg string) time.Duration {
	if cg == "" {
		return 0
	}
	for _, p := range []string{filepath.Join(cg, "cpuacct.usage"), strings.Replace(filepath.Join(cg, "cpuacct.usage"), "/cgroup/cpu/", "/cgroup/cpuacct/", 1)} {
		if b, err := os.ReadFile(p); err == nil {
			if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				return time.Duration(v)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(cg, "cpu.stat")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return time.Duration(n) * time.Microsecond
			}
		}
	}
	return 0
}

// cgroupRSS is the resident memory of the processes of cgroup cg (the sum
// of their VmRSS), 0 when unknown.
func cgroupRSS(cg string) int64 {
	if cg == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	if err != nil {
		return 0
	}
	var sum int64
	for _, pid := range strings.Fields(string(b)) {
		st, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				sum += kb << 10
			}
		}
	}
	return sum
}

// loadAvg is the machine's load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// sustained says whether the stream's rate was sustained, a line of
// figures and a verdict: creation to Running (every kind) p50 and p99 of
// the pods created in each third of the stream, and the mean backlog
// (pods created, not yet Running, sampled every 5 s) in each third.
// Sustained: the last third's p99 at most 1.5 times the first's, and its
// mean backlog at most 1.5 times the first's plus one pod (no queue
// building up); caller holds s.mu.
func (s *rateStream) sustained(rate float64) string {
	var d [3][]time.Duration
	var span time.Duration
	for _, p := range s.pods {
		span = max(span, p.created.Sub(s.start))
	}
	for _, p := range s.pods {
		if p.running.IsZero() || span <= 0 {
			continue
		}
		i := min(int(3*float64(p.created.Sub(s.start))/float64(span)), 2)
		d[i] = append(d[i], p.running.Sub(p.created))
	}
	var bl [3]float64
	for i := range 3 {
		part := s.backlog[i*len(s.backlog)/3 : (i+1)*len(s.backlog)/3]
		for _, n := range part {
			bl[i] += float64(n) / float64(len(part))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "by third of the stream: creation to Running p50/p99")
	for i := range 3 {
		fmt.Fprintf(&b, " %s/%s", ms(pct(d[i], 0.5)), ms(pct(d[i], 0.99)))
	}
	fmt.Fprintf(&b, "; backlog (created, not Running) mean %.1f %.1f %.1f, max %d",
		bl[0], bl[1], bl[2], slices.Max(append([]int{0}, s.backlog...)))
	ok := pct(d[2], 0.99) <= pct(d[0], 0.99)*3/2 && bl[2] <= 1.5*bl[0]+1
	fmt.Fprintf(&b, "; sustained at %.2f a second: %v\n", rate, ok)
	return b.String()
}
