package scale

import (
	"context"
	"errors"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// StartClusterBound starts the control plane and n nodes that the bench
// itself keeps Ready, without kwok: the CI smoke's cluster, whose pods
// are bound and never Running (no kubelet or simulator runs them). The
// scheduler sees the same Nodes and slices as with kwok: each Node is
// created Ready, and its Lease in kube-node-lease is renewed as a
// kubelet renews it, which the node lifecycle controller reads as the
// node's heartbeat. Pods that tolerated the not-ready taints instead
// would make the scheduler evaluate other pods on other nodes than the
// bench measures.
func StartClusterBound(ctx context.Context, n int, logf func(string, ...any)) (*Cluster, error) {
	hc, err := harness.StartCluster(ctx, harness.ClusterOptions{ControlPlaneOnly: true, ControlPlaneQPS: controlPlaneQPS,
		ControllerManagerArgs: []string{"--node-monitor-grace-period", nodeMonitorGrace}})
	if err != nil {
		return nil, err
	}
	c := &Cluster{Cluster: hc, Logf: logf, BoundOnly: true}
	if err := c.start(ctx, nil, n); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

// Stop stops the bound-only nodes' heartbeat, then the cluster.
func (c *Cluster) Stop() error {
	if c.stopBeat != nil {
		c.stopBeat()
	}
	return c.Cluster.Stop()
}

// readyNode is node with the Ready condition a kubelet reports.
func readyNode(node *corev1.Node) *corev1.Node {
	now := metav1.Now()
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: "KubeletReady", Message: "kept Ready by the scale bench", LastHeartbeatTime: now, LastTransitionTime: now}}
	return node
}

// renewLease creates or renews node name's Lease, as its kubelet would.
func (c *Cluster) renewLease(ctx context.Context, name string) error {
	leases := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr(name), LeaseDurationSeconds: ptr(int32(leaseSeconds)), RenewTime: &now}},
			metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// startHeartbeat renews every node's Lease each quarter of leaseSeconds
// (a kubelet's cadence for its lease) until Stop.
func (c *Cluster) startHeartbeat(ctx context.Context) {
	ctx, c.stopBeat = context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		tick := time.NewTicker(leaseSeconds * time.Second / 4)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			nodes := c.nodeNames()
			if err := parallel(ctx, len(nodes), func(ctx context.Context, i int) error { return c.renewLease(ctx, nodes[i]) }); err != nil && ctx.Err() == nil {
				c.Logf("renewing the nodes' leases: %v", err)
			}
		}
	}()
}
