package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// PrepareResourceClaims implements kubeletplugin.DRAPlugin: for each
// claim, the CDI device of each of its devices that this node's pool
// holds, with the claim's CDI spec written and the claim in the
// checkpoint. A claim already prepared gets the same answer again (the
// kubelet asks again after restarts), when its record still matches its
// allocation and the node. Calls may run side by side (the helper's
// serialization is off, Serve): each claim is prepared under mu, and
// waiting for its MPS daemon (waitMPS) holds no lock.
func (d *Driver) PrepareResourceClaims(ctx context.Context, cs []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(cs))
	for _, c := range cs {
		start := time.Now()
		d.mu.Lock()
		locked := time.Now()
		st := d.node.State()
		byName := map[string]unit{}
		for _, u := range units(st) {
			byName[u.name] = u
		}
		devs, err := d.prepareMade(ctx, c, byName, st)
		d.mu.Unlock()
		if err == nil {
			// Under MPS, the claim stays prepared while its daemon
			// comes up (nri-gpu mps starts it from the checkpoint); the
			// kubelet asks again until it is ready.
			err = d.waitMPS(ctx, c, devs)
		}
		if err != nil {
			d.log.WithFields(logrus.Fields{"claim": c.Namespace + "/" + c.Name, "uid": c.UID}).WithError(err).Warn("DRA: claim not prepared")
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: d.result(devs)}
		d.log.WithFields(logrus.Fields{"claim": c.Namespace + "/" + c.Name, "uid": c.UID, "devices": len(devs),
			"waited": locked.Sub(start).Round(time.Microsecond), "took": time.Since(start).Round(time.Microsecond)}).Info("DRA: claim prepared")
	}
	return out, nil
}

func (d *Driver) result(devs []claims.Device) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(devs))
	for _, dv := range devs {
		kd := kubeletplugin.Device{Requests: []string{dv.Request}, PoolName: d.nodeName, DeviceName: dv.Name, CDIDeviceIDs: []string{dv.CDIDevice}}
		if dv.Share.ID != "" {
			id := types.UID(dv.Share.ID)
			kd.ShareID = &id
		}
		out = append(out, kd)
	}
	return out
}

// prepareMade prepares one claim as prepareOne does, the MIG devices it
// was allocated on GPUs of dra.dynamicMIG made first (and destroyed
// again when it cannot be prepared); the caller holds mu.
func (d *Driver) prepareMade(ctx context.Context, c *resourceapi.ResourceClaim, byName map[string]unit, st *node.State) ([]claims.Device, error) {
	now, undo, err := d.makePartitions(c, st, byName)
	if err != nil {
		return nil, err
	}
	if now != st {
		st, byName = now, map[string]unit{}
		for _, u := range units(st) {
			byName[u.name] = u
		}
	}
	devs, err := d.prepareOne(ctx, c, byName, st)
	if err != nil {
		undo()
		return nil, err
	}
	if len(dynamicGPUs(st)) > 0 {
		uuids := make([]string, 0, len(devs))
		for _, dv := range devs {
			uuids = append(uuids, dv.UUID)
		}
		d.adoptPartitions(string(c.UID), uuids)
	}
	return devs, nil
}

// prepareOne prepares one claim, without waiting for its MPS daemon; the
// caller holds mu.
func (d *Driver) prepareOne(ctx context.Context, c *resourceapi.ResourceClaim, byName map[string]unit, st *node.State) ([]claims.Device, error) {
	uid := string(c.UID)
	nodes := nodesOf(st)
	if cc, ok := d.ckpt.Claims[uid]; ok {
		why := d.allocationMismatch(cc, c)
		if why == "" {
			why, _ = identityMismatch(cc, byName)
		}
		if why != "" {
			if err := d.dropRecord(c); err != nil {
				return nil, err
			}
			d.log.WithFields(logrus.Fields{"claim": c.Namespace + "/" + c.Name, "uid": uid}).Warnf("DRA: released a stale preparation: %s", why)
			return nil, fmt.Errorf("prepare claim %s/%s: its preparation is stale: %s; it was released, and the claim is prepared afresh when the kubelet asks again",
				c.Namespace, c.Name, why)
		}
		// Its spec may be gone (a tmpfs /var/run/cdi after a reboot), its
		// metadata files too (a crash at the first prepare).
		if err := d.rewriteMetadata(c, cc, byName, st); err != nil {
			return nil, err
		}
		devs := d.ckpt.Claims[uid].devices(uid)
		if err := d.writeClaimSpec(uid, devs, nodes); err != nil {
			return nil, err
		}
		return devs, nil
	}
	devs, err := d.claimDevices(c, byName, st)
	if err != nil {
		return nil, err
	}
	next := d.ckpt.clone()
	dropped, err := d.dropStale(ctx, c, devs, &next, st.Config.DRA.MemoryShares.AcrossNamespaces)
	if err != nil {
		return nil, err
	}
	files, err := claimMetadata(c, d.opts.DriverName, d.nodeName, devs, d.attributes(byName, st))
	if err != nil {
		return nil, fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	mounts := metadataMounts(d.opts.PluginDir, uid, files)
	for i := range devs {
		devs[i].Metadata = mounts[resourceclaim.BaseRequestRef(devs[i].Request)]
	}
	next.Claims[uid] = checkpointClaim{Namespace: c.Namespace, Name: c.Name, Devices: checkpointDevices(devs)}
	nextFiles := d.files.without(dropped...).with(uid, mounts)
	// The NRI side books the claim's devices first: a GPU that a
	// node-local request holds exclusively refuses the claim, naming its
	// holder, before anything is written.
	if d.opts.Book != nil {
		// With the daemons' readiness as last probed: a second claim of a
		// GPU whose daemon is ready changes no status, so no later probe
		// tells the request path again.
		booked, _ := withStatus(next.prepared(nextFiles), d.mpsStatus)
		if err := d.opts.Book(booked, uid); err != nil {
			return nil, fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
		}
	}
	// The metadata files before the checkpoint (New removes those of
	// claims it does not name), the checkpoint before the spec: a spec is
	// never on disk without the record that removes it (New removes
	// specs the checkpoint does not name).
	if err := writeMetadata(d.opts.PluginDir, uid, files); err != nil {
		d.tell(d.prepared.Load()) // the claim is not prepared: its booking goes
		_ = removeMetadata(d.opts.PluginDir, uid)
		return nil, fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	if err := next.write(d.opts.PluginDir); err != nil {
		d.tell(d.prepared.Load())
		_ = removeMetadata(d.opts.PluginDir, uid)
		return nil, fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	d.install(next, nextFiles)
	d.removeSpecs(dropped)
	d.removeMetadataOf(dropped)
	if err := d.writeClaimSpec(uid, devs, nodes); err != nil {
		return nil, err
	}
	return devs, nil
}

func (d *Driver) writeClaimSpec(uid string, devs []claims.Device, nodes map[string]inventory.DeviceNode) error {
	spec, err := claimSpec(d.opts.DriverName, d.opts.DevRoot, uid, devs, nodes)
	if err != nil {
		return err
	}
	return writeSpec(d.opts.CDIDir, d.opts.DriverName, uid, spec)
}

// claimDevices returns the devices of c's allocation that are this
// node's: an allocation of this driver in another pool, a device the
// node does not publish now, or an unhealthy one (unless the request has
// adminAccess) fails the claim with what the node has.
func (d *Driver) claimDevices(c *resourceapi.ResourceClaim, byName map[string]unit, st *node.State) ([]claims.Device, error) {
	if c.Status.Allocation == nil {
		return nil, fmt.Errorf("prepare claim %s/%s: not allocated", c.Namespace, c.Name)
	}
	ref := claims.Claim{UID: string(c.UID), Namespace: c.Namespace, Name: c.Name}
	cfgs, err := parseConfigs(d.opts.DriverName, c.Status.Allocation.Devices.Config)
	if err != nil {
		return nil, fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	var out []claims.Device
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.opts.DriverName {
			continue
		}
		if r.Pool != d.nodeName {
			return nil, fmt.Errorf("prepare claim %s/%s: request %s: pool %q is not this node's (%s)", c.Namespace, c.Name, r.Request, r.Pool, d.nodeName)
		}
		u, ok := byName[r.Device]
		if !ok {
			return nil, fmt.Errorf("prepare claim %s/%s: request %s: device %q is not on this node now (it has %s)", c.Namespace, c.Name, r.Request, r.Device, names(byName))
		}
		admin := r.AdminAccess != nil && *r.AdminAccess
		if why := st.Unhealthy[u.gpu.UUID]; why != "" && !admin {
			return nil, fmt.Errorf("prepare claim %s/%s: request %s: device %s (%s) is unhealthy: %s", c.Namespace, c.Name, r.Request, u.name, u.gpu.UUID, why)
		}
		id, nodes := identity(u)
		dv := claims.Device{Claim: ref, Request: r.Request, Name: u.name, UUID: u.gpu.UUID, MIG: u.gpu.MIG != nil,
			Node: id.Path, AdminAccess: admin, CDIDevice: CDIKind(d.opts.DriverName) + "=" + cdiName(ref.UID, u.name)}
		for _, n := range nodes {
			dv.Nodes = append(dv.Nodes, n.Path)
		}
		sh, err := shareOf(r, u, shareable(st.Config, u) && !d.noShares.Load())
		if err != nil {
			return nil, fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
		}
		dv.Share = sh
		gpuCfg, err := sharingFor(cfgs, r.Request, u.gpu.UUID, u.gpu.MIG != nil)
		if err != nil {
			return nil, fmt.Errorf("prepare claim %s/%s: request %s: %w", c.Namespace, c.Name, r.Request, err)
		}
		dv.Sharing = gpuCfg.Strategy
		if gpuCfg.MPS != nil {
			dv.MPS = d.claimMPS(u.gpu.UUID, *gpuCfg.MPS)
		}
		out = append(out, dv)
	}
	if err := checkMPSClaim(out); err != nil {
		return nil, fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	if err := shareLimits(d.opts.DriverName, out); err != nil {
		return nil, fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	return out, nil
}

// dropStale removes from next the prepared claims that hold a device devs
// need and no longer exist: deleted (NotFound), replaced by a claim of
// the same name (another UID), or no longer allocated that device, and
// returns their UIDs; so are shares that leave no room for a new share
// (fitShares) or that are of another namespace's claims (oneNamespace,
// unless acrossNamespaces). Such a claim never blocks a new pod; its CDI spec
// goes once the checkpoint without it is written (removeSpecs). A claim
// that still holds the device fails the new one, naming it.
func (d *Driver) dropStale(ctx context.Context, c *resourceapi.ResourceClaim, devs []claims.Device, next *checkpoint, acrossNamespaces bool) ([]string, error) {
	var dropped []string
	for _, dv := range devs {
		if dv.AdminAccess {
			continue
		}
		for uid, other := range next.Claims {
			held := slices.IndexFunc(other.Devices, func(o checkpointDevice) bool { return !o.AdminAccess && overlaps(o, dv) })
			if held < 0 || bothShares(other.Devices[held], dv) {
				continue // shares: fitShares below
			}
			gone, why, err := d.claimGone(ctx, uid, other, other.Devices[held])
			if err != nil {
				return nil, fmt.Errorf("prepare claim %s/%s: device %s is prepared for claim %s/%s (%s), which cannot be looked up: %w", c.Namespace, c.Name, dv.Name, other.Namespace, other.Name, uid, err)
			}
			if !gone {
				return nil, fmt.Errorf("prepare claim %s/%s: device %s is prepared for claim %s/%s (%s), which still holds it", c.Namespace, c.Name, dv.Name, other.Namespace, other.Name, uid)
			}
			d.log.WithFields(logrus.Fields{"claim": other.Namespace + "/" + other.Name, "uid": uid, "device": dv.Name}).
				Warnf("DRA: releasing a prepared claim that %s: its device goes to claim %s/%s", why, c.Namespace, c.Name)
			delete(next.Claims, uid)
			dropped = append(dropped, uid)
		}
		gone, err := d.fitShares(ctx, c, dv, next)
		if err != nil {
			return nil, err
		}
		dropped = append(dropped, gone...)
		if !acrossNamespaces {
			gone, err := d.oneNamespace(ctx, c, dv, next)
			if err != nil {
				return nil, err
			}
			dropped = append(dropped, gone...)
		}
	}
	return dropped, nil
}

// removeSpecs removes the CDI specs of the claims uids, which the
// checkpoint on disk no longer lists; a spec that cannot be removed is
// logged (New removes it at the next start: the checkpoint names no such
// claim).
func (d *Driver) removeSpecs(uids []string) {
	for _, uid := range uids {
		if err := removeSpec(d.opts.CDIDir, d.opts.DriverName, uid); err != nil {
			d.log.WithField("uid", uid).WithError(err).Warn("DRA: removing the CDI spec of a released claim")
		}
	}
}

// overlaps reports whether a prepared device and a new one share a GPU:
// the same device, or a GPU and one of its MIG devices (a layout change
// between the two).
func overlaps(o checkpointDevice, n claims.Device) bool {
	return o.UUID == n.UUID || o.MIG != n.MIG && sharesNode(o.Nodes, n.Nodes)
}

func sharesNode(a, b []string) bool {
	for _, x := range a {
		if strings.HasPrefix(x, "/dev/nvidia") && !strings.HasPrefix(x, "/dev/nvidia-") && slices.Contains(b, x) {
			return true
		}
	}
	return false
}

// claimGone asks the API server whether the prepared claim uid still
// exists and is still allocated device; why says how it is gone.
func (d *Driver) claimGone(ctx context.Context, uid string, cc checkpointClaim, device checkpointDevice) (gone bool, why string, err error) {
	got, err := d.client.ResourceV1().ResourceClaims(cc.Namespace).Get(ctx, cc.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, "was deleted", nil
	case err != nil:
		return false, "", err
	case string(got.UID) != uid:
		return true, "was deleted and its name reused", nil
	case got.Status.Allocation == nil:
		return true, "is no longer allocated", nil
	}
	for _, r := range got.Status.Allocation.Devices.Results {
		if r.Driver == d.opts.DriverName && r.Pool == d.nodeName && r.Device == device.Device && shareIDOf(r) == device.ShareID {
			return false, "", nil
		}
	}
	if device.ShareID != "" {
		return true, "is no longer allocated that share of the device", nil
	}
	return true, "is no longer allocated that device", nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: each claim
// leaves the checkpoint and its CDI spec and device metadata files are
// removed. A claim that is not prepared is no error (the kubelet may ask
// twice).
func (d *Driver) UnprepareResourceClaims(_ context.Context, cs []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(cs))
	next := d.ckpt.clone()
	uids := make([]string, 0, len(cs))
	for _, c := range cs {
		delete(next.Claims, string(c.UID))
		uids = append(uids, string(c.UID))
		out[c.UID] = nil
	}
	if len(next.Claims) != len(d.ckpt.Claims) {
		if err := next.write(d.opts.PluginDir); err != nil {
			return nil, fmt.Errorf("unprepare claims: %w", err)
		}
		d.install(next, d.files.without(uids...))
		d.tell(d.prepared.Load())
	}
	gone := make(map[string]bool, len(cs))
	for _, c := range cs {
		out[c.UID] = errors.Join(removeSpec(d.opts.CDIDir, d.opts.DriverName, string(c.UID)), removeMetadata(d.opts.PluginDir, string(c.UID)))
		gone[string(c.UID)] = true
	}
	if len(dynamicGPUs(d.node.State())) > 0 {
		d.destroyClaimPartitions(gone)
	}
	return out, nil
}

// nodesOf returns the device nodes of st's devices by path.
func nodesOf(st *node.State) map[string]inventory.DeviceNode {
	out := map[string]inventory.DeviceNode{}
	if st == nil {
		return out
	}
	snap := st.Snapshot()
	for _, g := range snap.GPUs {
		out[g.Node.Path] = g.Node
	}
	for _, m := range snap.MIG {
		out[m.GINode.Path] = m.GINode
		out[m.CINode.Path] = m.CINode
	}
	return out
}

func names(byName map[string]unit) string {
	if len(byName) == 0 {
		return "no devices"
	}
	ns := make([]string, 0, len(byName))
	for n := range byName {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return strings.Join(ns, ", ")
}

// attributes returns, by device name, the attributes the ResourceSlice
// publishes for the device (sliceDevice): what its metadata file says.
// The caller holds mu (pcieRoot).
func (d *Driver) attributes(byName map[string]unit, st *node.State) func(string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	return func(name string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		u, ok := byName[name]
		if !ok || st == nil {
			return nil
		}
		return sliceDevice(u, st.Snapshot(), d.pcieRoot, nil).Attributes
	}
}

// rewriteMetadata writes the metadata files of claim c, prepared as cc,
// again, and installs them where they were not known (their files were
// missing at start): the request path then mounts them. The caller holds
// mu.
func (d *Driver) rewriteMetadata(c *resourceapi.ResourceClaim, cc checkpointClaim, byName map[string]unit, st *node.State) error {
	uid := string(c.UID)
	files, err := claimMetadata(c, d.opts.DriverName, d.nodeName, cc.devices(uid), d.attributes(byName, st))
	if err != nil {
		return fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	if err := writeMetadata(d.opts.PluginDir, uid, files); err != nil {
		return fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	mounts := metadataMounts(d.opts.PluginDir, uid, files)
	if maps.Equal(mounts, d.files[uid]) {
		return nil
	}
	d.install(d.ckpt, d.files.with(uid, mounts))
	d.tell(d.prepared.Load())
	return nil
}
