package pipeline

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// given is what the runtime and the kubelet gave a container before
// nri-gpu saw it, worked out once (classify): CreateContainer serves the
// container by it and Synchronize rebuilds its holding from it, so the
// two cannot disagree.
type given struct {
	// privileged is set when the runtime gave the container every host
	// device (isPrivileged): its device nodes say nothing of its GPUs,
	// and its claims' environment entries grant nothing.
	privileged bool
	// nodes are the devices whose nodes the container has (hasGPUNode),
	// in index order; none when privileged.
	nodes []inventory.GPU
	// gpus are the GPUs the runtime gave the container besides its
	// claims': those of nodes and of its CDI devices of the source's
	// kind, in index order, less the claims' devices and those whose
	// identity changed under a claim (stale).
	gpus []inventory.GPU
	// kubelet is set when gpus are the kubelet's assignment (nri-gpu's
	// device plugin's annotations, backed by nodes: kubeletAssignment).
	kubelet bool
	// claims are the devices of prepared claims the container holds
	// (heldClaims).
	claims []claimed
	// stale are the container's claim devices whose GPU is not the one
	// they were prepared on: the container is refused, and nothing is
	// booked for them.
	stale []staleClaim
	// warnings say what the container carries that was not trusted.
	warnings []string
}

// kind is what decides a container's path, as far as what it was given
// decides it: claims (any, or stale ones), the kubelet's assignment, the
// runtime's GPUs, or none of them (its own request decides: none,
// management, privileged, ownRequest).
type kind int

const (
	kindOwn kind = iota
	kindClaims
	kindKubelet
	kindRuntime
)

// kind returns what decides the container's path, in this precedence:
// its claims (with the kubelet's or the runtime's GPUs beside them), the
// kubelet's assignment, the runtime's GPUs, none.
func (g given) kind() kind {
	switch {
	case len(g.claims) > 0 || len(g.stale) > 0:
		return kindClaims
	case g.kubelet:
		return kindKubelet
	case len(g.gpus) > 0:
		return kindRuntime
	}
	return kindOwn
}

// gets returns the GPUs the container gets when the runtime decided
// them, whatever its request names: those whose device nodes it has
// (its claims' and any other), else those of its CDI devices.
func (g given) gets() []inventory.GPU {
	if len(g.nodes) > 0 {
		return g.nodes
	}
	return g.gpus
}

// classify works out what the runtime and the kubelet gave the
// container ctr of pod (given): one pass over its device nodes, CDI
// devices, claim environment entries and kubelet annotations. A GPU is
// the container's by one rule, its device node's number (hasGPUNode).
// Pure, and linear in what it reads; bounded reports a container too
// large to read first.
func (p *Path) classify(pod *api.PodSandbox, ctr *api.Container) given {
	devs := p.Source.Devices()
	g := given{privileged: isPrivileged(ctr)}
	if have := ctr.GetLinux().GetDevices(); !g.privileged && len(have) > 0 {
		for _, d := range devs {
			if !hasGPUNode(ctr, d) {
				continue
			}
			if g.nodes == nil {
				g.nodes = make([]inventory.GPU, 0, min(len(devs), len(have)))
			}
			g.nodes = append(g.nodes, d)
		}
	}
	var forged []string
	g.claims, g.stale, forged = heldClaims(devs, p.Claims, pod.GetNamespace(), ctr, g.privileged)
	if len(forged) > 0 {
		g.warnings = append(g.warnings, forgedWarning(forged))
	}
	cdi, warnings := cdiGPUs(devs, p.Source.Kind(), ctr)
	g.warnings = append(g.warnings, warnings...)
	// The GPUs of its nodes that are not its claims': the kubelet's
	// assignment must name exactly them.
	g.gpus = g.nodes
	if len(g.claims) > 0 || len(g.stale) > 0 {
		g.gpus = nil
		for _, d := range g.nodes {
			if !g.claimedUnit(d) {
				g.gpus = append(g.gpus, d)
			}
		}
	}
	kub, warn := kubeletAssignment(devs, pod, ctr, g.privileged, g.gpus)
	if warn != "" {
		g.warnings = append(g.warnings, warn)
	}
	g.kubelet = kub != nil
	if len(cdi) > 0 {
		g.gpus = slices.Clone(g.gpus) // not g.nodes' array, which sorting would reorder
		for _, d := range cdi {
			if !slices.ContainsFunc(g.gpus, func(o inventory.GPU) bool { return o.Index == d.Index }) && !g.claimedUnit(d) {
				g.gpus = append(g.gpus, d)
			}
		}
		slices.SortFunc(g.gpus, func(a, b inventory.GPU) int { return a.Index - b.Index })
	}
	return g
}

// claimedUnit reports whether d is a device of one of the container's
// claims, or the device now at the node of one of its stale ones.
func (g given) claimedUnit(d inventory.GPU) bool {
	return slices.ContainsFunc(g.claims, func(c claimed) bool { return c.unit.Index == d.Index }) ||
		slices.ContainsFunc(g.stale, func(s staleClaim) bool { return s.at && s.now.Index == d.Index })
}

// bounded refuses a container whose device nodes or CDI devices are more
// than the request path reads.
func bounded(ctr *api.Container) error {
	if n := len(ctr.GetLinux().GetDevices()); n > maxDevices {
		return fmt.Errorf("nri-gpu: container devices: %d device nodes (at most %d)", n, maxDevices)
	}
	if n := len(ctr.GetCDIDevices()); n > maxCDINames {
		return fmt.Errorf("nri-gpu: the runtime's CDI devices: the container has more than %d CDI devices", maxCDINames)
	}
	return nil
}

// isPrivileged reports whether the runtime gave the container every host
// device: a privileged container. containerd's CRI (checked with 2.4)
// gives one every device node of the host's /dev and one device cgroup
// rule, allow all: {allow: true, access: "rwm"}, no type, no numbers; a
// container given devices one by one (a device plugin's DeviceSpecs,
// --device) has a deny-all rule and one allow rule per device. So the
// rule tells them apart: a container whose device cgroup rules allow
// every device (an allow rule of type "a" or none, without major and
// minor, with read and write access), with no deny rule after it, is
// privileged, and its device nodes say nothing of which GPUs it was
// given. Kubernetes gives no unprivileged container such a rule, so a pod
// author cannot produce it without being privileged (and so root on the
// node already).
func isPrivileged(ctr *api.Container) bool {
	all := false
	for _, r := range ctr.GetLinux().GetResources().GetDevices() {
		every := (r.GetType() == "" || r.GetType() == "a") && anyNumber(r.GetMajor()) && anyNumber(r.GetMinor())
		switch {
		case r.GetAllow() && every && strings.Contains(r.GetAccess(), "r") && strings.Contains(r.GetAccess(), "w"):
			all = true
		case !r.GetAllow():
			all = false
		}
	}
	return all
}

// anyNumber reports whether a device cgroup rule's major or minor matches
// every number: unset, or -1 (the runtime spec's wildcard).
func anyNumber(n *api.OptionalInt64) bool { return n == nil || n.GetValue() == -1 }

// hasGPUNode reports whether the container's spec has g's device node:
// the request path's one rule for "the container has this GPU", at
// CreateContainer and at Synchronize. By number (a character device of
// g's major and minor, whatever its path: the number is what the device
// cgroup allows), not by path; for a MIG device, its parent's node and its
// compute instance's capability node.
func hasGPUNode(c *api.Container, g inventory.GPU) bool {
	have := c.GetLinux().GetDevices()
	return hasNode(have, g.Node) && (g.MIG == nil || hasNode(have, g.MIG.CINode))
}

// hasNode reports whether the devices hold n, by number: a character
// device (type "c", or no type) of n's major and minor.
func hasNode(have []*api.LinuxDevice, n inventory.DeviceNode) bool {
	for _, d := range have {
		if (d.GetType() == "c" || d.GetType() == "") && d.GetMajor() == n.Major && d.GetMinor() == n.Minor {
			return true
		}
	}
	return false
}

// cdiGPUs returns the GPUs named by the container's CDI devices of the
// source's kind (nvidia.com/gpu=<index, UUID or all>, and NVIDIA's device
// plugin's for an NVIDIA source), in index order, without duplicates; a
// name that is no device of the inventory is reported.
func cdiGPUs(devs []inventory.GPU, sourceKind string, c *api.Container) ([]inventory.GPU, []string) {
	var out []inventory.GPU
	var warnings []string
	for _, d := range c.GetCDIDevices() {
		vendor, class, id, err := parser.ParseQualifiedName(d.GetName())
		if err != nil || !nvidiaCDIKind(vendor+"/"+class, sourceKind) {
			continue
		}
		if id == "all" {
			out = append(out, devs...)
			continue
		}
		g, ok := findGPU(devs, id)
		if !ok {
			warnings = append(warnings, "CDI device "+d.GetName()+" names no GPU or MIG device of the inventory")
			continue
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b inventory.GPU) int { return a.Index - b.Index })
	return slices.CompactFunc(out, func(a, b inventory.GPU) bool { return a.Index == b.Index }), warnings
}

// findGPU finds a GPU by index, UUID (case-insensitive) or the CDI name
// of another vendor's device, or a MIG device by UUID or <gpu>:<mig>.
func findGPU(devs []inventory.GPU, id string) (inventory.GPU, bool) {
	if id == "" {
		return inventory.GPU{}, false
	}
	n, err := strconv.Atoi(id)
	for _, g := range devs {
		if err == nil && g.Index == n && g.MIG == nil || strings.EqualFold(g.UUID, id) || g.Name == id || g.MIG != nil && g.MIG.Name() == id {
			return g, true
		}
	}
	return inventory.GPU{}, false
}

// unitAt returns the device of the inventory that the device node at
// path identifies: a whole GPU by its node, a MIG device by its compute
// instance's capability node (claims.Device.Node).
func unitAt(devs []inventory.GPU, path string) (inventory.GPU, bool) {
	for _, g := range devs {
		if g.MIG == nil && g.Node.Path == path || g.MIG != nil && g.MIG.CINode.Path == path {
			return g, true
		}
	}
	return inventory.GPU{}, false
}

// identity says whether claim device d is still the device the inventory
// has at d's identifying node: "" when it is, else what happened to it.
// It returns the device now at that node, if any (ok).
func identity(devs []inventory.GPU, d claims.Device) (now inventory.GPU, ok bool, why string) {
	g, ok := unitAt(devs, d.Node)
	switch {
	case !ok:
		return g, false, fmt.Sprintf("device %s (%s, %s) is not in the node's inventory now", d.Name, d.UUID, d.Node)
	case !strings.EqualFold(g.UUID, d.UUID):
		return g, true, fmt.Sprintf("device %s was prepared as %s at %s, which is %s now (the driver was reloaded or the GPU replaced since)", d.Name, d.UUID, d.Node, g.UUID)
	}
	return g, true, ""
}

// few joins at most 8 names, and says how many more there are: a record
// may be forged, and a log line should stay a line.
func few(names []string) string {
	const most = 8
	if len(names) <= most {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:most], ", ") + " and " + strconv.Itoa(len(names)-most) + " more"
}
