package scale

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// Feature is a kind of claim pod the bench measures.
type Feature string

// The features, each on the variant it needs.
const (
	// Baseline: pods without claims (a GPU-less cluster: no slices).
	Baseline Feature = "no GPU"
	// Plain: a claim of one whole GPU of the driver's gpu class.
	Plain Feature = "1 GPU"
	// CEL: a claim of one GPU selected by CEL on productName and memory.
	CEL Feature = "1 GPU, CEL on productName and memory"
	// Share: a claim of a 4Gi memory share of a GPU (consumable capacity).
	Share Feature = "4Gi memory share"
	// MIGDevice: a claim of one 1g.10gb MIG device (static MIG).
	MIGDevice Feature = "1 MIG 1g.10gb"
)

// Variant is the variant f's claims are allocated from.
func (f Feature) Variant() Variant {
	switch f {
	case Share:
		return Shares
	case MIGDevice:
		return MIG
	}
	return Whole
}

// celSelector selects a GPU by NVIDIA's attributes and capacity: CEL
// reads both shapes the same (an unqualified name in the driver's domain,
// a qualified one in its own).
const celSelector = `device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3' && ` +
	`device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('64Gi')) >= 0`

// migSelector selects a MIG device by its profile.
const migSelector = `device.attributes['gpu.nvidia.com'].profile == '1g.10gb'`

// claimOf is the claim of feature f on shape s.
func claimOf(s *Shape, f Feature, name string) *resourceapi.ResourceClaim {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: s.GPUClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	sel := func(expr string) []resourceapi.DeviceSelector {
		return []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
	}
	switch f {
	case CEL:
		req.Selectors = sel(celSelector)
	case Share:
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{s.MemoryCapacity: resource.MustParse("4Gi")}}
	case MIGDevice:
		req.DeviceClassName = s.MIGClass
		req.Selectors = sel(migSelector)
	}
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}}}
}

// podOf is a pod with the claim claim ("" for none).
func podOf(name, claim string) *corev1.Pod {
	zero := int64(0)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "scale"}},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	if claim != "" {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	}
	return p
}

// Result is one measurement: pods of one feature on one shape created
// as fast as the bench can, at one fill.
type Result struct {
	Nodes   int     `json:"nodes"`
	Shape   string  `json:"shape"`
	Feature Feature `json:"feature"`
	Fill    float64 `json:"fill"`
	Round   int     `json:"round"`
	Pods    int     `json:"pods"`
	// PodsPerSec is Pods over the time from the scheduler's resume, all
	// of them made, to the last one bound: its rate on a full queue.
	PodsPerSec float64 `json:"podsPerSec"`
	// CreatedPerSec is how fast the bench created them (the scheduler
	// paused meanwhile).
	CreatedPerSec float64 `json:"createdPerSec"`
	// BoundP50, BoundP99: the scheduler's resume to each pod bound;
	// RunningP50, RunningP99: to each pod Running (kwok; 0 on a
	// BoundOnly cluster).
	BoundP50   time.Duration `json:"boundP50"`
	BoundP99   time.Duration `json:"boundP99"`
	RunningP50 time.Duration `json:"runningP50"`
	RunningP99 time.Duration `json:"runningP99"`
	// SchedulerCPU, APIServerCPU and EtcdCPU are the CPU time each took
	// per pod, from the scheduler's resume to the last pod bound.
	SchedulerCPU time.Duration `json:"schedulerCPUPerPod"`
	APIServerCPU time.Duration `json:"apiserverCPUPerPod"`
	EtcdCPU      time.Duration `json:"etcdCPUPerPod"`
	Load         string        `json:"load"`
	// allocated are the devices the pods' claims got, by claim.
	allocated map[string][]deviceID
}

// deviceID is an allocated device: driver, pool, device, share ("" for
// a whole device).
type deviceID struct{ driver, pool, device, share string }

// podTimes are when each pod was created (its create call answered), and
// when the bench's watch saw it bound and Running.
type podTimes struct {
	mu                      sync.Mutex
	created, bound, running map[string]time.Time
	// resumed is when the scheduler was resumed, every pod made.
	resumed time.Time
	// want is how many pods the measurement makes; allBound is closed
	// when the watch has seen them all bound.
	want     int
	allBound chan struct{}
}

func (p *podTimes) set(m map[string]time.Time, name string, t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := m[name]; !ok {
		m[name] = t
	}
}

// setBound records name bound at t, and closes allBound once every pod
// is.
func (p *podTimes) setBound(name string, t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.bound[name]; ok {
		return
	}
	p.bound[name] = t
	if len(p.bound) == p.want {
		close(p.allBound)
	}
}

func (p *podTimes) count(m map[string]time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(m)
}

// Measure creates n pods of feature f on shape s (nil for Baseline),
// their claims first, then the pods from createParallelism goroutines
// with the scheduler paused, and times each from the scheduler's resume
// to bound and (unless the cluster is BoundOnly) to Running; then it deletes them and their claims and waits until the claims are
// gone (their devices free again).
func (c *Cluster) Measure(ctx context.Context, s *Shape, f Feature, n int) (Result, error) {
	ns := fmt.Sprintf("m-%d", c.seq.Add(1))
	r := Result{Nodes: len(c.Nodes), Feature: f, Pods: n, Shape: "none", Load: LoadAvg()}
	if s != nil {
		r.Shape = s.Name
	}
	if err := c.namespace(ctx, ns); err != nil {
		return r, err
	}
	defer func() {
		_ = c.Client.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{})
	}()
	claim := func(i int) string {
		if f == Baseline {
			return ""
		}
		return fmt.Sprintf("c-%d", i)
	}
	if f != Baseline {
		err := parallel(ctx, n, func(ctx context.Context, i int) error {
			_, err := c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claimOf(s, f, claim(i)), metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return r, fmt.Errorf("claims: %w", err)
		}
	}
	t := &podTimes{created: map[string]time.Time{}, bound: map[string]time.Time{}, running: map[string]time.Time{},
		want: n, allBound: make(chan struct{})}
	w, err := c.watchPods(ctx, ns)
	if err != nil {
		return r, err
	}
	go watchPods(w, t)
	// The scheduler waits while the pods are made: it then drains a full
	// queue, as Kubernetes' scheduler_perf measures it, and how fast this
	// client creates pods on a loaded machine does not limit the figure.
	if err := c.Signal("kube-scheduler", syscall.SIGSTOP); err != nil {
		w.Stop()
		return r, err
	}
	stopped := true
	var cpu0 cpuSample
	resume := func() {
		if stopped {
			stopped = false
			cpu0 = c.cpu()
			t.mu.Lock()
			t.resumed = time.Now()
			t.mu.Unlock()
			_ = c.Signal("kube-scheduler", syscall.SIGCONT)
		}
	}
	defer resume()
	err = parallel(ctx, n, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("p-%d", i)
		_, err := c.Client.CoreV1().Pods(ns).Create(ctx, podOf(name, claim(i)), metav1.CreateOptions{})
		t.set(t.created, name, time.Now())
		return err
	})
	resume()
	if err != nil {
		w.Stop()
		return r, fmt.Errorf("pods: %w", err)
	}
	select {
	case <-t.allBound:
		cpu1 := c.cpu()
		r.SchedulerCPU = (cpu1.scheduler - cpu0.scheduler) / time.Duration(n)
		r.APIServerCPU = (cpu1.apiserver - cpu0.apiserver) / time.Duration(n)
		r.EtcdCPU = (cpu1.etcd - cpu0.etcd) / time.Duration(n)
	case <-time.After(5 * time.Minute):
		w.Stop()
		return r, fmt.Errorf("%d pods of %s on %s: %d bound in 5 min\n--- tail of the scheduler's log ---\n%s", n, f, r.Shape, t.count(t.bound), c.LogTail("kube-scheduler", 3000))
	case <-ctx.Done():
		w.Stop()
		return r, ctx.Err()
	}
	if !c.BoundOnly {
		err = c.waitCount(ctx, fmt.Sprintf("%d pods of %s on %s bound and Running", n, f, r.Shape), n, func(context.Context) (int, error) {
			return t.count(t.running), nil
		})
	}
	w.Stop()
	if err != nil {
		return r, fmt.Errorf("%w (%d bound)\n--- tail of the scheduler's log ---\n%s", err, t.count(t.bound), c.LogTail("kube-scheduler", 3000))
	}
	r.summarize(t)
	if f != Baseline {
		if r.allocated, err = c.allocations(ctx, ns); err != nil {
			return r, err
		}
	}
	if err := c.clean(ctx, ns); err != nil {
		return r, err
	}
	return r, nil
}

// watchPods is a watch of ns's pods that survives the API server ending
// it (client-go's RetryWatcher, from a list's resource version).
func (c *Cluster) watchPods(ctx context.Context, ns string) (watch.Interface, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return watchtools.NewRetryWatcherWithContext(ctx, l.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.Client.CoreV1().Pods(ns).Watch(ctx, o)
		}})
}

// watchPods records when w first shows each pod bound and Running.
func watchPods(w watch.Interface, t *podTimes) {
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			continue
		}
		now := time.Now()
		if p.Spec.NodeName != "" {
			t.setBound(p.Name, now)
		}
		if p.Status.Phase == corev1.PodRunning {
			t.set(t.running, p.Name, now)
		}
	}
}

// summarize sets r's rate and latencies from t.
func (r *Result) summarize(t *podTimes) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var first, last, lastCreated time.Time
	var bound, running []time.Duration
	for name, c := range t.created {
		if first.IsZero() || c.Before(first) {
			first = c
		}
		if c.After(lastCreated) {
			lastCreated = c
		}
		b := t.bound[name]
		if b.After(last) {
			last = b
		}
		bound = append(bound, b.Sub(t.resumed))
		if run, ok := t.running[name]; ok {
			running = append(running, run.Sub(t.resumed))
		}
	}
	r.PodsPerSec = float64(len(t.created)) / last.Sub(t.resumed).Seconds()
	r.CreatedPerSec = float64(len(t.created)) / lastCreated.Sub(first).Seconds()
	r.BoundP50, r.BoundP99 = percentile(bound, 0.5), percentile(bound, 0.99)
	r.RunningP50, r.RunningP99 = percentile(running, 0.5), percentile(running, 0.99)
}

// percentile is the q-th quantile of d (nearest rank).
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(q*float64(len(d))+0.5) - 1
	return d[min(max(i, 0), len(d)-1)]
}

// clean force-deletes ns's pods, then its claims, and waits until the
// claims are gone: the resource claim controller frees a claim's devices
// once its pod is gone.
func (c *Cluster) clean(ctx context.Context, ns string) error {
	zero := int64(0)
	if err := c.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		return err
	}
	return c.deleteClaims(ctx, ns)
}

// allocations are the devices allocated to the claims of ns, by claim.
func (c *Cluster) allocations(ctx context.Context, ns string) (map[string][]deviceID, error) {
	l, err := c.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string][]deviceID{}
	for _, cl := range l.Items {
		if cl.Status.Allocation == nil {
			return nil, fmt.Errorf("claim %s/%s: not allocated, though its pod is bound", ns, cl.Name)
		}
		for _, res := range cl.Status.Allocation.Devices.Results {
			id := deviceID{driver: res.Driver, pool: res.Pool, device: res.Device}
			if res.ShareID != nil {
				id.share = string(*res.ShareID)
			}
			out[cl.Name] = append(out[cl.Name], id)
		}
	}
	return out, nil
}
