package dra

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
)

// A prepared claim's record is checked, before it is answered again,
// against what it stands for: the claim's allocation now (the same UID
// may have been deallocated and allocated other devices meanwhile) and
// the node now (after a driver reload or a GPU swapped, /dev/nvidia0 may
// be another GPU). A record that no longer matches is stale: it leaves
// the checkpoint, its CDI spec goes, and the prepare fails naming the
// mismatch; the kubelet asks again and the claim is prepared afresh.

// identityMismatch says how a record's devices differ from the node's
// devices byName now ("" when each is the same GPU at the same device
// node): a device gone, or, replaced set, another GPU at its name or node.
func identityMismatch(cc checkpointClaim, byName map[string]unit) (why string, replaced bool) {
	for _, rec := range cc.Devices {
		u, ok := byName[rec.Device]
		if !ok {
			return fmt.Sprintf("device %s (%s) is not on this node now", rec.Device, rec.UUID), false
		}
		id, _ := identity(u)
		if u.gpu.UUID != rec.UUID || id.Path != rec.Node {
			return fmt.Sprintf("device %s was prepared as %s at %s, and is %s at %s now (a driver reload or a GPU replaced)", rec.Device, rec.UUID, rec.Node, u.gpu.UUID, id.Path), true
		}
	}
	return "", false
}

// allocationMismatch says how a record differs from the claim c's
// allocation of this driver now ("" when it is the same): not allocated,
// other devices, other requests, other shares, adminAccess changed.
func (d *Driver) allocationMismatch(cc checkpointClaim, c *resourceapi.ResourceClaim) string {
	if c.Status.Allocation == nil {
		return "the claim is no longer allocated"
	}
	var now []resourceapi.DeviceRequestAllocationResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == d.opts.DriverName {
			now = append(now, r)
		}
	}
	if len(now) != len(cc.Devices) {
		return fmt.Sprintf("it was prepared with %d devices, and is allocated %d now", len(cc.Devices), len(now))
	}
	for i, r := range now {
		rec := cc.Devices[i]
		admin := r.AdminAccess != nil && *r.AdminAccess
		if r.Pool != d.nodeName || r.Device != rec.Device || r.Request != rec.Request || shareIDOf(r) != rec.ShareID || admin != rec.AdminAccess {
			return fmt.Sprintf("request %s was prepared with device %s (share %q, adminAccess %v), and is allocated device %s of pool %s now (share %q, adminAccess %v)",
				r.Request, rec.Device, rec.ShareID, rec.AdminAccess, r.Device, r.Pool, shareIDOf(r), admin)
		}
	}
	return ""
}

// dropRecord releases the stale record of claim c: the checkpoint without
// it is written and booked, then its spec goes. The caller holds mu.
func (d *Driver) dropRecord(c *resourceapi.ResourceClaim) error {
	uid := string(c.UID)
	next := d.ckpt.clone()
	delete(next.Claims, uid)
	if err := next.write(d.opts.PluginDir); err != nil {
		return fmt.Errorf("prepare claim %s/%s: releasing its stale preparation: %w", c.Namespace, c.Name, err)
	}
	d.install(next)
	d.tell(d.prepared.Load())
	d.removeSpecs([]string{uid})
	return nil
}
