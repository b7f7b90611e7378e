package dra

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// Memory shares through DRA's consumable capacity (KEP-5075): a GPU that
// dra.memoryShares names is published with allowMultipleAllocations and
// its memory capacity (gpu.nvidia.com/memory) with a request policy:
//
//   - default: the whole memory, so that a claim that asks for no memory
//     consumes all of it and has the GPU alone, as without sharing;
//   - validRange: from dra.memoryShares.minimum to the whole memory, in
//     steps of 1Mi (MPS limits memory in MiB), where the GPU's memory is
//     a whole number of MiB (else without a step).
//
// A claim that requests capacity.requests['gpu.nvidia.com/memory'] gets a
// share: the scheduler puts claims on the GPU while their consumed memory
// fits, and records each one's shareID and consumedCapacity in its
// allocation, which PrepareResourceClaims reads (shareOf).

// MemoryCapacity is the capacity a claim requests memory of.
const MemoryCapacity = resourceapi.QualifiedName(NVIDIADomain + "/memory")

// ConsumableCapacityGate is the Kubernetes feature gate without which the
// API server drops the fields of a shareable device.
const ConsumableCapacityGate = "DRAConsumableCapacity"

// shareable reports whether u is published shareable by memory under
// cfg: a whole GPU that dra.memoryShares.devices names, whose memory NVML
// reported, larger than the minimum share.
func shareable(cfg config.Config, u unit) bool {
	m := cfg.DRA.MemoryShares
	if !m.Enabled() || u.gpu.MIG != nil || u.gpu.Props == nil {
		return false
	}
	return config.DeviceList(m.Devices).Matches(u.gpu, u.parent) && int64(u.gpu.Props.MemoryBytes) > m.MinimumBytes()
}

// makeShareable makes d, whose memory capacity is set, shareable by
// memory from minimum bytes up.
func makeShareable(d *resourceapi.Device, minimum int64) {
	mem, ok := d.Capacity[MemoryCapacity]
	if !ok {
		return
	}
	total := mem.Value.Value()
	whole := mem.Value.DeepCopy()
	r := &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(minimum, resource.BinarySI)}
	if total%(1<<20) == 0 {
		r.Step = resource.NewQuantity(1<<20, resource.BinarySI)
	}
	mem.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: &whole, ValidRange: r}
	d.Capacity[MemoryCapacity] = mem
	yes := true
	d.AllowMultipleAllocations = &yes
}

// shareOf returns the share of the allocation result r on the unit u: none
// where r has no share ID (a device not shared by memory, or an API server
// without consumable capacity). A share ID on a device this node does not
// publish shareable, or a consumed memory that is missing, not positive
// or more than the GPU's, fails the claim, naming the field.
func shareOf(r resourceapi.DeviceRequestAllocationResult, u unit, isShareable bool) (claims.Share, error) {
	if r.ShareID == nil || *r.ShareID == "" {
		return claims.Share{}, nil
	}
	field := fmt.Sprintf("status.allocation.devices.results[request %s, device %s]", r.Request, r.Device)
	if !isShareable {
		return claims.Share{}, fmt.Errorf("%s.shareID %q: device %s is not published shareable by memory on this node now (dra.memoryShares.devices does not name it)", field, *r.ShareID, u.name)
	}
	var total uint64
	if u.gpu.Props != nil {
		total = u.gpu.Props.MemoryBytes >> 20
	}
	q, ok := r.ConsumedCapacity[MemoryCapacity]
	if !ok {
		return claims.Share{}, fmt.Errorf("%s.consumedCapacity: no %s (it has %s): the share's memory is unknown", field, MemoryCapacity, capacityNames(r.ConsumedCapacity))
	}
	v, ok := q.AsInt64()
	if !ok || v < 1<<20 {
		return claims.Share{}, fmt.Errorf("%s.consumedCapacity[%s]: %s is not a memory size of at least 1Mi", field, MemoryCapacity, q.String())
	}
	mib := uint64(v) >> 20
	if mib > total {
		return claims.Share{}, fmt.Errorf("%s.consumedCapacity[%s]: %s is more than the GPU's memory (%dMi)", field, MemoryCapacity, q.String(), total)
	}
	return claims.Share{ID: string(*r.ShareID), MemoryMiB: mib, GPUMemoryMiB: total}, nil
}

func capacityNames(m map[resourceapi.QualifiedName]resource.Quantity) string {
	if len(m) == 0 {
		return "none"
	}
	ns := make([]string, 0, len(m))
	for n := range m {
		ns = append(ns, string(n))
	}
	sort.Strings(ns)
	return fmt.Sprint(ns)
}

// shareIDOf is r's share ID, "" for none.
func shareIDOf(r resourceapi.DeviceRequestAllocationResult) string {
	if r.ShareID == nil {
		return ""
	}
	return string(*r.ShareID)
}

// bothShares reports whether the prepared device o and the new device n
// are two shares of one GPU, which the scheduler allocated side by side.
func bothShares(o checkpointDevice, n claims.Device) bool {
	return o.ShareID != "" && n.Share.ID != "" && o.UUID == n.UUID && o.ShareID != n.Share.ID
}

// sharedMiB is the memory of the shares prepared in next on the GPU uuid.
func sharedMiB(next checkpoint, uuid string) uint64 {
	var sum uint64
	for _, cc := range next.Claims {
		for _, pd := range cc.Devices {
			if pd.UUID == uuid && pd.ShareID != "" && !pd.AdminAccess {
				sum += pd.ShareMiB
			}
		}
	}
	return sum
}

// fitShares makes room for the new share n in next: the scheduler
// allocates shares whose memory fits in the GPU, so prepared shares that
// leave no room for n are stale (a claim deleted, or no longer allocated
// its share, without an unprepare) and are dropped with their CDI specs.
// Shares whose claims still hold them fail n, naming them. The caller
// holds mu.
func (d *Driver) fitShares(ctx context.Context, c *resourceapi.ResourceClaim, n claims.Device, next *checkpoint) ([]string, error) {
	if n.Share.ID == "" || sharedMiB(*next, n.UUID)+n.Share.MemoryMiB <= n.Share.GPUMemoryMiB {
		return nil, nil
	}
	uids := make([]string, 0, len(next.Claims))
	for uid := range next.Claims {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	var live, dropped []string
	for _, uid := range uids {
		other := next.Claims[uid]
		at := slices.IndexFunc(other.Devices, func(o checkpointDevice) bool { return bothShares(o, n) && !o.AdminAccess })
		if at < 0 {
			continue
		}
		gone, why, err := d.claimGone(ctx, uid, other, other.Devices[at])
		if err != nil {
			return nil, fmt.Errorf("prepare claim %s/%s: device %s: its shares leave no room for %dMi, and claim %s/%s (%s), which holds one, cannot be looked up: %w",
				c.Namespace, c.Name, n.Name, n.Share.MemoryMiB, other.Namespace, other.Name, uid, err)
		}
		if !gone {
			live = append(live, fmt.Sprintf("%s/%s (%dMi)", other.Namespace, other.Name, other.Devices[at].ShareMiB))
			continue
		}
		d.log.WithFields(logrus.Fields{"claim": other.Namespace + "/" + other.Name, "uid": uid, "device": n.Name}).
			Warnf("DRA: releasing a prepared share whose claim %s: its memory goes to claim %s/%s", why, c.Namespace, c.Name)
		delete(next.Claims, uid)
		dropped = append(dropped, uid)
	}
	if used := sharedMiB(*next, n.UUID); used+n.Share.MemoryMiB > n.Share.GPUMemoryMiB {
		return nil, fmt.Errorf("prepare claim %s/%s: device %s: a share of %dMi does not fit: %dMi of its %dMi are prepared for claims %s, which still hold them",
			c.Namespace, c.Name, n.Name, n.Share.MemoryMiB, used, n.Share.GPUMemoryMiB, strings.Join(live, ", "))
	}
	return dropped, nil
}

// oneNamespace refuses the new share n of claim c beside a share of the
// same GPU prepared for a claim of another namespace (dropping such
// shares whose claims are gone, whose UIDs it returns): one MPS control
// daemon serves every share of a GPU, through one read-write pipe
// directory holding its control socket, so the clients of one share can
// reach the daemon the others use (quit it, change its defaults, remove
// its pipes), and the daemon's own defaults are the whole GPU
// (sharemps.go). Shares of one namespace trust each other as the
// containers of one pod do; dra.memoryShares.acrossNamespaces lets
// namespaces that trust each other share. The message the pod sees does
// not name the other namespace; the log does. The caller holds mu.
func (d *Driver) oneNamespace(ctx context.Context, c *resourceapi.ResourceClaim, n claims.Device, next *checkpoint) ([]string, error) {
	if !n.Share.Partial() {
		return nil, nil
	}
	uids := make([]string, 0, len(next.Claims))
	for uid := range next.Claims {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	var dropped []string
	for _, uid := range uids {
		other := next.Claims[uid]
		if other.Namespace == c.Namespace {
			continue
		}
		at := slices.IndexFunc(other.Devices, func(o checkpointDevice) bool {
			return o.UUID == n.UUID && o.ShareID != "" && o.ShareMiB < o.GPUMemoryMiB && !o.AdminAccess
		})
		if at < 0 {
			continue
		}
		gone, why, err := d.claimGone(ctx, uid, other, other.Devices[at])
		if err == nil && gone {
			d.log.WithFields(logrus.Fields{"claim": other.Namespace + "/" + other.Name, "uid": uid, "device": n.Name}).
				Warnf("DRA: releasing a prepared share whose claim %s: the GPU goes to the shares of namespace %s", why, c.Namespace)
			delete(next.Claims, uid)
			dropped = append(dropped, uid)
			continue
		}
		d.log.WithFields(logrus.Fields{"claim": c.Namespace + "/" + c.Name, "device": n.Name, "held by": other.Namespace + "/" + other.Name}).
			Warn("DRA: a share refused beside another namespace's share (dra.memoryShares.acrossNamespaces is off)")
		return nil, fmt.Errorf("prepare claim %s/%s: device %s: its memory is shared with a claim of another namespace, and nri-gpu shares a GPU's memory between claims of one namespace only: "+
			"one MPS control daemon, whose control socket is in the pipe directory every share's containers mount read-write, serves every share of the GPU "+
			"(dra.memoryShares.acrossNamespaces: true allows it where namespaces trust each other); the claim is prepared once those shares are released, when the kubelet asks again",
			c.Namespace, c.Name, n.Name)
	}
	return dropped, nil
}
