package scale

import (
	"context"
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
)

// fillNamespace holds the claims that fill the cluster.
const fillNamespace = "fill"

// maxResults is how many devices one allocation may hold
// (resource.k8s.io/v1's AllocationResultsMaxSize).
const maxResults = resourceapi.AllocationResultsMaxSize

// Fill allocates the fraction frac of the cluster's devices of shape s's
// variant v as the scheduler would have: ResourceClaims whose status
// holds an allocation of each node's first devices, in its slice's order
// (where the scheduler, which tries them in that order, puts claims),
// frac of the devices in all, each node within one of the others; for
// Shares, every GPU with one share of frac of its memory (consumed
// capacity). The claims have no consumer, which the resource claim
// controller leaves allocated; the scheduler counts their devices
// allocated. It returns what it allocated.
func (c *Cluster) Fill(ctx context.Context, s *Shape, v Variant, frac float64) (*Filled, error) {
	filled := &Filled{devices: map[deviceID]bool{}}
	if frac <= 0 {
		return filled, nil
	}
	start := time.Now()
	if err := c.namespace(ctx, fillNamespace); err != nil {
		return nil, err
	}
	per := s.DeviceCount(v)
	total := int(math.Round(frac * float64(per*len(c.Nodes))))
	if v == Shares {
		total = per * len(c.Nodes)
	}
	var claims []*resourceapi.ResourceClaim
	for i, nodeName := range c.Nodes {
		k := total / len(c.Nodes)
		if i < total%len(c.Nodes) {
			k++
		}
		devs := s.Devices(v, i)[:min(k, per)]
		for _, d := range devs {
			filled.devices[deviceID{driver: s.Driver, pool: nodeName, device: d.Name}] = true
		}
		for j := 0; j < len(devs); j += maxResults {
			claims = append(claims, fillClaim(s, v, nodeName, fmt.Sprintf("fill-%s-%d", nodeName, j/maxResults), devs[j:min(j+maxResults, len(devs))], frac))
		}
	}
	err := parallel(ctx, len(claims), func(ctx context.Context, i int) error {
		want := claims[i]
		got, err := c.Client.ResourceV1().ResourceClaims(fillNamespace).Create(ctx, want, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		got.Status = want.Status
		_, err = c.Client.ResourceV1().ResourceClaims(fillNamespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fill %s %s to %.0f%%: %w", s.Name, v, frac*100, err)
	}
	if v == Shares {
		q := shareOf(s, frac)
		filled.share = q.Value()
	}
	c.Logf("filled %s's %s to %.0f%%: %d devices in %d claims in %s", s.Name, v, frac*100, total, len(claims), time.Since(start).Round(time.Millisecond))
	return filled, nil
}

// Filled is what a Fill allocated: whole devices, or on each GPU a
// share of share bytes.
type Filled struct {
	devices map[deviceID]bool
	share   int64
}

// shareOf is the fill's share of each GPU at frac, whole Mi.
func shareOf(s *Shape, frac float64) resource.Quantity {
	return quantity(int64(frac*float64(s.GPUMemory())) >> 20 << 20)
}

// fillClaim is a claim of devs on nodeName, allocated; for Shares each
// device's share is frac of its memory.
func fillClaim(s *Shape, v Variant, nodeName, name string, devs []resourceapi.Device, frac float64) *resourceapi.ResourceClaim {
	class := s.GPUClass
	if v == MIG {
		class = s.MIGClass
	}
	req := resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(len(devs))}
	var share resource.Quantity
	if v == Shares {
		share = shareOf(s, frac)
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{s.MemoryCapacity: share}}
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "r", Exactly: &req}}}},
	}
	alloc := &resourceapi.AllocationResult{NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{nodeName}}}}}}}
	for _, d := range devs {
		r := resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: s.Driver, Pool: nodeName, Device: d.Name}
		if v == Shares {
			id := types.UID(uuid.NewUUID())
			r.ShareID = &id
			r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{s.MemoryCapacity: share}
		}
		alloc.Devices.Results = append(alloc.Devices.Results, r)
	}
	claim.Status.Allocation = alloc
	return claim
}

// ClearFill deletes the fill's claims and waits until they are gone.
func (c *Cluster) ClearFill(ctx context.Context) error {
	return c.deleteClaims(ctx, fillNamespace)
}

// deleteClaims deletes every claim of ns and waits until none is left.
func (c *Cluster) deleteClaims(ctx context.Context, ns string) error {
	claims := c.Client.ResourceV1().ResourceClaims(ns)
	if err := claims.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	return c.waitCount(ctx, "claims of "+ns+" deleted", 0, func(ctx context.Context) (int, error) {
		l, err := claims.List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		return len(l.Items), nil
	})
}

// namespace creates ns unless it exists, with its default service
// account (which pods are admitted with; the controller manager makes it
// too, a moment later).
func (c *Cluster) namespace(ctx context.Context, ns string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	_, err = c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}
