// Package sharing says how the node's GPUs are shared through the kubelet
// device plugin's replicas (devicePlugin.sharing): which extended resource
// each device (GPU or MIG device) is advertised as, as how many replicas,
// and, for GPUs shared with MPS, where their MPS control daemon's pipes
// are, which limits it holds each replica's clients to, and whether it is
// ready. A Plan is a pure value computed from the configuration and a
// snapshot; the device plugin advertises it, nri-gpu mps runs its daemons,
// and the request path reads it from the node's state without I/O.
package sharing

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Strategies, as NVIDIA's device plugin names them.
const (
	TimeSlicing = "time-slicing"
	MPS         = "mps"
)

// MIG strategies of the device plugin (devicePlugin.migStrategy).
const (
	MIGStrategyNone   = "none"
	MIGStrategySingle = "single"
	MIGStrategyMixed  = "mixed"
)

// MIGResourcePrefix starts the resource of a MIG profile under migStrategy
// mixed: nvidia.com/mig-1g.10gb, as NVIDIA's device plugin names it.
const MIGResourcePrefix = "nvidia.com/mig-"

// Spec is what a plan is made from: the devicePlugin configuration's
// keys that decide it (config.DevicePlugin.SharingSpec), as plain values,
// so that this package, which the request path reads, imports no
// configuration code.
type Spec struct {
	// ResourceName is devicePlugin.resourceName; MIGStrategy its
	// migStrategy (MIGStrategyNone, ...).
	ResourceName, MIGStrategy string
	// Policy is sharedDevicesAllocationPolicy; MPSRoot mpsRoot.
	Policy, MPSRoot string
	// Strategy is TimeSlicing, MPS or "" (no sharing).
	Strategy                   string
	FailRequestsGreaterThanOne bool
	Resources                  []Resource
	// Offered reports whether the device plugin offers unit g at all
	// (devicePlugin.devices: the other GPUs are DRA's, one allocator per
	// GPU); nil offers every unit.
	Offered func(g inventory.GPU) bool
}

// Resource is one replicated resource of a Spec.
type Resource struct {
	// Name is the resource replicated, SharedName the one its replicas
	// are advertised as (Name unless renamed).
	Name, SharedName string
	Replicas         int
	// Devices: the first Count of Name's devices when Count > 0, those
	// List names when List is set, else all.
	Count int
	List  []string
	// Key names the resource's devices key in messages.
	Key string
}

// Unit is one device as the device plugin advertises it.
type Unit struct {
	// GPU is the device: a GPU, or a MIG device's unit.
	GPU inventory.GPU
	// Resource is the extended resource it is advertised as.
	Resource string
	// Replicas is how many devices it is advertised as: 1 for a device
	// handed out whole (device ID = its UUID), else its replicas
	// (device IDs ReplicaID(UUID, 0..Replicas-1)).
	Replicas int
}

// Share is how one replicated device is shared.
type Share struct {
	// UUID is the device's (a GPU's or a MIG device's).
	UUID string
	// Resource is the extended resource its replicas are advertised as.
	Resource string
	// Strategy is TimeSlicing or MPS.
	Strategy string
	// Replicas is how many replicas it is advertised as (at least 2).
	Replicas int
	// FailRequestsGreaterThanOne refuses a container given more than one
	// device of Resource.
	FailRequestsGreaterThanOne bool
	// MPS is set under the MPS strategy.
	MPS *MPSDaemon
}

// String says what the device is shared as, for messages: "4
// time-slicing replicas of nvidia.com/gpu".
func (s Share) String() string {
	return strconv.Itoa(s.Replicas) + " " + s.Strategy + " replicas of " + s.Resource
}

// MPSLimits are the limits an MPS control daemon holds each client
// process to: the one description of them that the device plugin's plan,
// the DRA driver (a claim's GpuConfig, its checkpoint), nri-gpu mps (the
// daemon's defaults, its ready file) and the request path (a client's
// environment) share. Its JSON is the form of the ready file and of the
// DRA checkpoint: a field added here changes both, and bumps both
// versions.
type MPSLimits struct {
	// ActiveThreadPercentage is the share of the GPU's threads
	// (set_default_active_thread_percentage,
	// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), 1 to 100.
	ActiveThreadPercentage int `json:"activeThreadPercentage"`
	// PinnedMemoryMiB is the device memory (set_default_device_pinned_mem_limit,
	// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); 0: no memory limit.
	PinnedMemoryMiB uint64 `json:"pinnedMemoryMiB"`
}

// Limits returns the limits as the MPS control commands and the client
// environment write them: the thread percentage ("25") and the pinned
// memory limit of device 0 of a client that sees only this GPU
// ("20389M"; "" without one).
func (l MPSLimits) Limits() (threads, memory string) {
	threads = strconv.Itoa(l.ActiveThreadPercentage)
	if l.PinnedMemoryMiB > 0 {
		memory = strconv.FormatUint(l.PinnedMemoryMiB, 10) + "M"
	}
	return threads, memory
}

// String says the limits for a message: "25% of the threads and 20389
// MiB", "100% of the threads and no memory limit".
func (l MPSLimits) String() string {
	if l.PinnedMemoryMiB == 0 {
		return fmt.Sprintf("%d%% of the threads and no memory limit", l.ActiveThreadPercentage)
	}
	return fmt.Sprintf("%d%% of the threads and %d MiB", l.ActiveThreadPercentage, l.PinnedMemoryMiB)
}

// MPSDaemon is the MPS control daemon of one GPU as containers use it:
// a device plugin's MPS GPU (Plan), or a DRA claim's (claims.Device.MPS).
type MPSDaemon struct {
	// PipeDir, LogDir are the daemon's CUDA_MPS_PIPE_DIRECTORY and
	// CUDA_MPS_LOG_DIRECTORY on the host: <mpsRoot>/<UUID>/pipe, /log
	// (DaemonDirs). A client container mounts PipeDir.
	PipeDir, LogDir string
	// ShmDir is the host directory that is /dev/shm to the daemon, its
	// servers and every client container: <mpsRoot>/shm.
	ShmDir string
	// MPSLimits are the limits it holds each client process to: a
	// replica's (100 / replicas of the threads, the GPU's memory /
	// replicas; no memory limit when NVML did not report the GPU's
	// memory), or a claim's (its mpsConfig, or its memory share's).
	MPSLimits
	// Ready says that the daemon runs with these limits (nri-gpu mps says
	// so, and keeps saying so); new clients may be given the GPU only
	// then. Why says why not, when it is not.
	Ready bool
	Why   string
}

// NotReported is why a daemon is not ready before its first probe.
const NotReported = "nri-gpu mps has not reported the MPS control daemon ready"

// SameDaemon reports whether a and b are the same daemon with the same
// limits, whatever their readiness.
func SameDaemon(a, b *MPSDaemon) bool {
	return a.PipeDir == b.PipeDir && a.LogDir == b.LogDir && a.ShmDir == b.ShmDir && a.MPSLimits == b.MPSLimits
}

// Plan is the node's sharing: every device the device plugin advertises,
// and how the replicated ones are shared. It is never modified; WithMPS
// returns a copy.
type Plan struct {
	// Units are the advertised devices, in the snapshot's order (GPUs by
	// index, then MIG devices).
	Units []Unit
	// Shares are the replicated devices, by UUID.
	Shares map[string]Share
	// Policy is sharedDevicesAllocationPolicy.
	Policy string
	// Warnings are entries of devices lists that name no device of the
	// node.
	Warnings []string
}

// ReplicaSeparator joins a device's UUID and a replica number in the
// replica's device ID (<uuid>::<n>), as NVIDIA's device plugin does.
const ReplicaSeparator = "::"

// ReplicaID returns the device ID of replica n of the device uuid.
func ReplicaID(uuid string, n int) string { return uuid + ReplicaSeparator + strconv.Itoa(n) }

// SplitReplicaID returns the device UUID and replica number of a replica's
// device ID; ok is false for an ID that is no replica's (a whole device's
// UUID) or is malformed.
func SplitReplicaID(id string) (uuid string, n int, ok bool) {
	uuid, num, found := strings.Cut(id, ReplicaSeparator)
	if !found || uuid == "" || num == "" || len(num) > 4 || num[0] == '+' || num[0] == '-' {
		return "", 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil || (len(num) > 1 && num[0] == '0') {
		return "", 0, false
	}
	return uuid, n, true
}

// BaseResource returns the resource the device plugin advertises g as
// without sharing, by migStrategy: a whole GPU as resourceName; a MIG
// device as resourceName under single, as nvidia.com/mig-<profile> under
// mixed, and not at all under none. A MIG-enabled GPU is never advertised
// whole.
func BaseResource(c Spec, g inventory.GPU) (string, bool) {
	switch {
	case g.MIGEnabled:
		return "", false
	case g.MIG == nil:
		return c.ResourceName, true
	case c.MIGStrategy == MIGStrategySingle:
		return c.ResourceName, true
	case c.MIGStrategy == MIGStrategyMixed:
		return MIGResourcePrefix + g.MIG.Profile, true
	}
	return "", false
}

// NewPlan returns the sharing of units (what the node may hand out, as
// adjust.Source.Devices lists them) under c. Every MPS daemon is planned
// not ready until WithMPS says otherwise.
func NewPlan(c Spec, units []inventory.GPU) *Plan {
	p := &Plan{Shares: map[string]Share{}, Policy: c.Policy}
	byBase := map[string][]int{} // unit positions by base resource
	for _, g := range units {
		res, ok := BaseResource(c, g)
		if !ok || g.ID() == "" || c.Offered != nil && !c.Offered(g) {
			continue
		}
		byBase[res] = append(byBase[res], len(p.Units))
		p.Units = append(p.Units, Unit{GPU: g, Resource: res, Replicas: 1})
	}
	if c.Strategy == "" {
		return p
	}
	for _, r := range c.Resources {
		picked, warnings := pick(r, p.Units, byBase[r.Name])
		p.Warnings = append(p.Warnings, warnings...)
		for _, at := range picked {
			u := &p.Units[at]
			u.Resource, u.Replicas = r.SharedName, r.Replicas
			sh := Share{UUID: u.GPU.ID(), Resource: u.Resource, Strategy: c.Strategy, Replicas: r.Replicas, FailRequestsGreaterThanOne: c.FailRequestsGreaterThanOne}
			if c.Strategy == MPS {
				sh.MPS = mpsDaemon(c.MPSRoot, u.GPU, r.Replicas)
			}
			p.Shares[sh.UUID] = sh
		}
	}
	return p
}

// DaemonDirs returns the pipe, log and shm directories of the MPS
// control daemon of the GPU or MIG device uuid under mpsRoot root:
// <root>/<uuid>/pipe, <root>/<uuid>/log, and <root>/shm, which every
// daemon shares. The
// device plugin's daemons and those of DRA claims are placed alike (a
// GPU is offered by one of the two).
func DaemonDirs(root, uuid string) (pipe, log, shm string) {
	return path.Join(root, uuid, "pipe"), path.Join(root, uuid, "log"), path.Join(root, "shm")
}

// IsMIG reports whether uuid is a MIG device's (NVML's MIG-<uuid>):
// the MPS control daemon of a MIG device is started with
// CUDA_VISIBLE_DEVICES set to it, as NVIDIA runs one daemon per MIG
// device, and no compute mode is set for it (nri-gpu sets compute modes
// on whole GPUs only: the GPU's other MIG devices are not the daemon's).
func IsMIG(uuid string) bool { return strings.HasPrefix(uuid, "MIG-") }

// mpsDaemon plans the MPS daemon of g, shared as replicas.
func mpsDaemon(root string, g inventory.GPU, replicas int) *MPSDaemon {
	pipe, log, shm := DaemonDirs(root, g.UUID)
	return &MPSDaemon{
		PipeDir: pipe, LogDir: log, ShmDir: shm,
		MPSLimits: MPSLimits{ActiveThreadPercentage: 100 / replicas, PinnedMemoryMiB: g.MemoryMiB / uint64(replicas)},
		Why:       NotReported,
	}
}

// pick returns the positions among units (those of candidates, the
// resource's devices in order) that r's devices select, and a warning for
// each list entry that selects none.
func pick(r Resource, units []Unit, candidates []int) ([]int, []string) {
	switch {
	case r.Count > 0:
		return candidates[:min(r.Count, len(candidates))], nil
	case r.List == nil:
		return candidates, nil
	}
	var out []int
	var warnings []string
	taken := map[int]bool{}
	for _, ref := range r.List {
		found := false
		for _, at := range candidates {
			if names(units[at].GPU, ref) {
				found = true
				if !taken[at] {
					taken[at] = true
					out = append(out, at)
				}
			}
		}
		if !found {
			warnings = append(warnings, fmt.Sprintf("%s: %s names no device of %s on this node: not replicated", r.Key, ref, r.Name))
		}
	}
	// In the units' order, whatever the list's.
	ordered := out[:0]
	for _, at := range candidates {
		if taken[at] {
			ordered = append(ordered, at)
		}
	}
	return ordered, warnings
}

// names reports whether the devices list entry ref names g: a GPU index, a
// <gpu>:<mig> MIG index, a UUID, or a MIG-GPU-<uuid>/<gi>/<ci> name.
func names(g inventory.GPU, ref string) bool {
	if strings.EqualFold(ref, g.UUID) {
		return true
	}
	if g.MIG == nil {
		return ref == strconv.Itoa(g.Index)
	}
	m := g.MIG
	return ref == m.Name() || strings.EqualFold(ref, fmt.Sprintf("MIG-%s/%d/%d", m.ParentUUID, m.GI, m.CI))
}

// Resources returns the resources the plan advertises, in the order
// their first device comes.
func (p *Plan) Resources() []string {
	var out []string
	seen := map[string]bool{}
	for _, u := range p.Units {
		if !seen[u.Resource] {
			seen[u.Resource] = true
			out = append(out, u.Resource)
		}
	}
	return out
}

// Share returns how the device uuid is shared; ok is false for a device
// handed out whole (or none of the node's).
func (p *Plan) Share(uuid string) (Share, bool) {
	if p == nil {
		return Share{}, false
	}
	s, ok := p.Shares[uuid]
	return s, ok
}

// MPSStatus is what nri-gpu mps reports of one GPU's daemon.
type MPSStatus struct {
	Ready bool
	Why   string
}

// WithMPS returns a copy of p whose MPS daemons have the readiness status
// says (by UUID; a GPU missing from it is not ready, with why), and
// whether anything changed. p is not modified.
func (p *Plan) WithMPS(status map[string]MPSStatus, missing string) (*Plan, bool) {
	out := *p
	out.Shares = make(map[string]Share, len(p.Shares))
	changed := false
	for id, s := range p.Shares {
		if s.MPS != nil {
			st, ok := status[id]
			if !ok {
				st = MPSStatus{Why: missing}
			}
			if !st.Ready && st.Why == "" {
				st.Why = "the MPS control daemon is not ready"
			}
			if st.Ready {
				st.Why = ""
			}
			if st.Ready != s.MPS.Ready || st.Why != s.MPS.Why {
				m := *s.MPS
				m.Ready, m.Why = st.Ready, st.Why
				s.MPS = &m
				changed = true
			}
		}
		out.Shares[id] = s
	}
	return &out, changed
}

// MPSDaemons returns the MPS daemons the plan needs, by GPU UUID.
func (p *Plan) MPSDaemons() map[string]*MPSDaemon {
	out := map[string]*MPSDaemon{}
	for id, s := range p.Shares {
		if s.MPS != nil {
			out[id] = s.MPS
		}
	}
	return out
}
