package scale

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// Node heartbeats: kwok renews each node's lease every quarter of
// leaseSeconds, as a kubelet does. A kubelet's 40 s lease is 0.1
// renewals a second per node, 100 a second for 1,000 nodes: load a real
// API server carries whatever the GPU driver, which on this 2-core
// machine would take CPU from the scheduler being measured. The bench
// renews every 150 s, and the node lifecycle controller waits that much
// longer before it calls a node lost.
const (
	leaseSeconds      = 600
	nodeMonitorGrace  = "20m"
	controlPlaneQPS   = 5000
	createParallelism = 16
)

// Cluster is the bench's cluster: the suite's control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler), kwok, and
// Nodes simulated GPU nodes that kwok serves.
type Cluster struct {
	*harness.Cluster
	Client kubernetes.Interface
	Nodes  []string
	Logf   func(format string, args ...any)
	seq    atomic.Int64
	// BoundOnly: no kwok, the bench keeps the nodes Ready itself
	// (StartClusterBound); pods are bound, never Running.
	BoundOnly bool
	stopBeat  context.CancelFunc
	mu        sync.Mutex // guards Nodes against the heartbeat's reads
}

// StartCluster starts the control plane at the suite's Kubernetes
// version, kwok, and n nodes, each Ready.
func StartCluster(ctx context.Context, n int, logf func(string, ...any)) (*Cluster, error) {
	kwok, err := harness.InstallKwok(ctx, "")
	if err != nil {
		return nil, err
	}
	hc, err := harness.StartCluster(ctx, harness.ClusterOptions{ControlPlaneOnly: true, ControlPlaneQPS: controlPlaneQPS,
		ControllerManagerArgs: []string{"--node-monitor-grace-period", nodeMonitorGrace}})
	if err != nil {
		return nil, err
	}
	c := &Cluster{Cluster: hc, Logf: logf}
	if err := c.start(ctx, kwok, n); err != nil {
		return nil, errors.Join(err, hc.Stop())
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, kwok *harness.Kwok, n int) error {
	cfg, err := c.RESTConfig(1e6, 1e6)
	if err != nil {
		return err
	}
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if kwok == nil {
		c.startHeartbeat(ctx)
	} else if err := c.StartKwokLease(kwok, leaseSeconds); err != nil {
		return err
	}
	return c.AddNodes(ctx, n)
}

// AddNodes adds nodes until there are n, and waits for all to be Ready.
func (c *Cluster) AddNodes(ctx context.Context, n int) error {
	start := time.Now()
	from := len(c.Nodes)
	c.mu.Lock()
	for i := from; i < n; i++ {
		c.Nodes = append(c.Nodes, fmt.Sprintf("gpu-%05d", i))
	}
	c.mu.Unlock()
	err := parallel(ctx, n-from, func(ctx context.Context, j int) error {
		node := simNode(c.Nodes[from+j], from+j)
		if c.BoundOnly {
			if err := c.renewLease(ctx, node.Name); err != nil {
				return err
			}
			node = readyNode(node)
		}
		_, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("create nodes: %w", err)
	}
	err = harness.WaitFor(ctx, 10*time.Minute, fmt.Sprintf("%d nodes Ready", n), func() (bool, string, error) {
		list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, "", err
		}
		ready := 0
		for i := range list.Items {
			if harness.NodeCondition(&list.Items[i], corev1.NodeReady) == corev1.ConditionTrue {
				ready++
			}
		}
		return ready >= n, fmt.Sprintf("%d of %d Ready", ready, n), nil
	})
	if err != nil && !c.BoundOnly {
		return fmt.Errorf("%w\n--- tail of kwok's log ---\n%s", err, c.LogTail("kwok", 3000))
	}
	if err != nil {
		return err
	}
	c.Logf("%d nodes Ready in %s", n-from, time.Since(start).Round(time.Millisecond))
	return nil
}

// nodeNames are the cluster's nodes now.
func (c *Cluster) nodeNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.Nodes)
}

// simNode is node i, which kwok serves: an 8-GPU machine's CPU, memory
// and pod capacity, and a pod network of its own (kwok gives its pods
// addresses from it; without one, from one /24 for all nodes).
func simNode(name string, i int) *corev1.Node {
	cidr := fmt.Sprintf("10.%d.%d.0/24", 64+i/256, i%256)
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("192"), corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods: resource.MustParse("110")}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{harness.KwokNodeAnnotation: "fake"},
			Labels: map[string]string{"kubernetes.io/hostname": name, "type": "kwok", "nvidia.com/gpu.present": "true"}},
		Spec:   corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
		Status: corev1.NodeStatus{Capacity: res, Allocatable: res},
	}
}

// Classes creates the DeviceClasses of the shapes.
func (c *Cluster) Classes(ctx context.Context, shapes ...*Shape) error {
	for _, s := range shapes {
		for i := range s.Classes {
			_, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, &s.Classes[i], metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		}
	}
	return nil
}

// Publish replaces every node's ResourceSlices with shape s's of
// variant v (none for a nil s), one pool per node named after it, as a
// driver's helper library publishes them, and waits until the API
// server lists them all.
func (c *Cluster) Publish(ctx context.Context, s *Shape, v Variant) error {
	start := time.Now()
	if err := c.Client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	if err := c.waitCount(ctx, "ResourceSlices deleted", 0, c.countSlices); err != nil {
		return err
	}
	if s == nil {
		return nil
	}
	err := parallel(ctx, len(c.Nodes), func(ctx context.Context, i int) error {
		_, err := c.Client.ResourceV1().ResourceSlices().Create(ctx, slice(s, v, i, c.Nodes[i]), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("publish %s %s: %w", s.Name, v, err)
	}
	if err := c.waitCount(ctx, "ResourceSlices published", len(c.Nodes), c.countSlices); err != nil {
		return err
	}
	c.Logf("published %s's %s slices on %d nodes in %s", s.Name, v, len(c.Nodes), time.Since(start).Round(time.Millisecond))
	return nil
}

// slice is node i's ResourceSlice of shape s, variant v.
func slice(s *Shape, v Variant, i int, nodeName string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName + "-" + strings.ReplaceAll(s.Driver, ".", "-")},
		Spec: resourceapi.ResourceSliceSpec{Driver: s.Driver, NodeName: &nodeName,
			Pool:    resourceapi.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: 1},
			Devices: s.Devices(v, i)},
	}
}

func (c *Cluster) countSlices(ctx context.Context) (int, error) {
	l, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	return len(l.Items), nil
}

// waitCount waits until count says want.
func (c *Cluster) waitCount(ctx context.Context, what string, want int, count func(context.Context) (int, error)) error {
	return harness.WaitFor(ctx, 10*time.Minute, what, func() (bool, string, error) {
		n, err := count(ctx)
		if err != nil {
			return false, "", err
		}
		return n == want, fmt.Sprintf("%d, want %d", n, want), nil
	})
}

// parallel runs f for 0..n-1 on createParallelism goroutines; the first
// error stops the rest.
func parallel(ctx context.Context, n int, f func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(createParallelism, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// LoadAvg is the machine's load average (/proc/loadavg's first three).
func LoadAvg() string {
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
