// Package claims is what the DRA kubelet plugin has prepared on the node,
// in the form the request path reads it at CreateContainer: which
// prepared ResourceClaim device each GPU or MIG device node stands for.
//
// A container of a pod with a claim gets, from the runtime, the device
// nodes of the claim's CDI devices (a pod author cannot add device nodes)
// and an environment entry per device naming its claim (which a pod author
// could forge). What the container is booked for is decided by the device
// nodes: an entry names a device only where the node that identifies it is
// in the container. A Prepared is immutable; the plugin swaps in a new one
// at every Prepare and Unprepare. Nothing here does I/O.
package claims

import (
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// EnvPrefix starts the environment entry that a prepared claim device's
// CDI spec sets in a container: EnvPrefix + the device's name in
// upper case with '-' as '_' (EnvKey), = the claim's UID.
const EnvPrefix = "NRI_GPU_DRA_"

// EnvKey returns the environment key of the claim device named name in
// the DRA pool ("gpu-0" -> NRI_GPU_DRA_GPU_0).
func EnvKey(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Claim names a ResourceClaim.
type Claim struct {
	UID       string
	Namespace string
	Name      string
}

// String is namespace/name (uid), for messages.
func (c Claim) String() string { return c.Namespace + "/" + c.Name + " (" + c.UID + ")" }

// Device is one device of a prepared claim.
type Device struct {
	Claim Claim
	// Request is the claim's request (or subrequest) it was allocated
	// for.
	Request string
	// Name is the device's name in the DRA pool: gpu-<minor>, or
	// NVIDIA's MIG name.
	Name string
	// UUID is the GPU's or the MIG device's UUID.
	UUID string
	// MIG is set for a MIG device.
	MIG bool
	// Node is the device node that identifies the device in a container:
	// /dev/nvidia<minor> of a GPU, the compute instance's
	// /dev/nvidia-caps/nvidia-cap<N> of a MIG device.
	Node string
	// Nodes are every device node its CDI device gives a container.
	Nodes []string
	// AdminAccess is set for a device of an adminAccess request: the
	// container gets it without holding it.
	AdminAccess bool
	// CDIDevice is the CDI device ID the kubelet hands the runtime.
	CDIDevice string
	// Share is set for a device published shareable by memory: the
	// claim's share of it (Share.Partial: less than the whole GPU).
	Share Share
	// Sharing is the claim's sharing strategy for the device, NVIDIA's
	// GpuConfig name: "" (none asked), "TimeSlicing" or "MPS".
	Sharing string
	// MPS is set under "MPS": the device's MPS control daemon, whose
	// client every container of the claim is, with the limits each
	// client gets (the claim's mpsConfig, or its memory share's), and
	// whether nri-gpu mps reports the daemon ready.
	MPS *sharing.MPSDaemon
}

// Prepared is the set of devices of the node's prepared claims.
type Prepared struct {
	devices []Device
	byNode  map[string][]int
	byEnv   map[string][]int
}

// New returns the set of devs (copied).
func New(devs []Device) *Prepared {
	p := &Prepared{devices: slices.Clone(devs), byNode: map[string][]int{}, byEnv: map[string][]int{}}
	for i, d := range p.devices {
		if d.MPS != nil {
			m := *d.MPS
			p.devices[i].MPS = &m
		}
		p.byNode[d.Node] = append(p.byNode[d.Node], i)
		p.byEnv[EnvKey(d.Name)] = append(p.byEnv[EnvKey(d.Name)], i)
	}
	return p
}

// Len is the number of prepared claim devices.
func (p *Prepared) Len() int {
	if p == nil {
		return 0
	}
	return len(p.devices)
}

// Devices returns every prepared claim device, in the order given to New.
func (p *Prepared) Devices() []Device {
	if p == nil {
		return nil
	}
	return slices.Clone(p.devices)
}

// ForContainer returns the claim devices a container holds: for each
// environment entry EnvKey(name)=<claim UID> in env, the device of that
// claim with that name, if its identifying node is among the container's
// device nodes. Entries that name no prepared device, or one whose node
// the container lacks, are returned in forged: the request path refuses or
// ignores them, never books them. Cost: linear in env and nodes.
func (p *Prepared) ForContainer(env []string, nodes []string) (held []Device, forged []string) {
	if p == nil {
		return nil, nil
	}
	has := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		has[n] = true
	}
	for _, e := range env {
		k, uid, ok := strings.Cut(e, "=")
		if !ok || !strings.HasPrefix(k, EnvPrefix) {
			continue
		}
		found := false
		for _, i := range p.byEnv[k] {
			d := p.devices[i]
			if d.Claim.UID == uid && has[d.Node] {
				held = append(held, d)
				found = true
				break
			}
		}
		if !found {
			forged = append(forged, e)
		}
	}
	return held, forged
}

// ByNode returns the prepared claim devices a device node identifies
// (several where claims share a device: adminAccess, or one device of
// several claims).
func (p *Prepared) ByNode(node string) []Device {
	if p == nil {
		return nil
	}
	var out []Device
	for _, i := range p.byNode[node] {
		out = append(out, p.devices[i])
	}
	return out
}

// Holdings returns, by GPU or MIG UUID, the UID of the claim that holds
// it: what node-local requests (annotations, environment) must see as
// held. An adminAccess device holds nothing; a device of a claim shared by
// several containers and pods is held once, by the claim.
func (p *Prepared) Holdings() map[string]string {
	if p == nil {
		return nil
	}
	out := map[string]string{}
	for _, d := range p.devices {
		if !d.AdminAccess {
			out[d.UUID] = d.Claim.UID
		}
	}
	return out
}
