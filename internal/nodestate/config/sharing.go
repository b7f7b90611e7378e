package config

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// DeviceSharing is devicePlugin.sharing: GPUs advertised as several devices
// (replicas) that containers share, in the shape of NVIDIA's device
// plugin (its sharing.timeSlicing and sharing.mps), so that a cluster's
// configuration carries over. At most one of the two is set.
type DeviceSharing struct {
	// TimeSlicing shares GPUs by time: the replicas of a GPU are handed
	// to containers that then run on it in turn, without limits.
	TimeSlicing *ReplicatedResources `json:"timeSlicing,omitempty"`
	// MPS shares GPUs through an MPS control daemon per GPU (nri-gpu mps),
	// each replica's client held to 1/replicas of the GPU's threads and
	// memory.
	MPS *ReplicatedResources `json:"mps,omitempty"`
}

// ReplicatedResources are the resources one sharing strategy replicates.
type ReplicatedResources struct {
	// RenameByDefault advertises each replicated resource as
	// <name>.shared unless its entry sets rename.
	RenameByDefault bool `json:"renameByDefault,omitempty"`
	// FailRequestsGreaterThanOne refuses a container that is given more
	// than one device of a replicated resource; unset is false under
	// timeSlicing and true under mps, as with NVIDIA's device plugin.
	FailRequestsGreaterThanOne *bool `json:"failRequestsGreaterThanOne,omitempty"`
	// Resources are the replicated resources.
	Resources []ReplicatedResource `json:"resources,omitempty"`
}

// ReplicatedResource is one resource whose devices are replicated.
type ReplicatedResource struct {
	// Name is a resource the device plugin serves: devicePlugin.resourceName,
	// or nvidia.com/mig-<profile> under migStrategy mixed.
	Name string `json:"name"`
	// Rename, when set, advertises the replicas as this resource, and
	// the devices that are not replicated stay under Name.
	Rename string `json:"rename,omitempty"`
	// Devices are the devices of Name that are replicated: "all" (the
	// default), a count (the first N by index) or a list of GPU indexes,
	// <gpu>:<mig> MIG indexes and GPU or MIG UUIDs.
	Devices ReplicatedDevices `json:"devices,omitempty"`
	// Replicas is how many devices each replicated device is advertised
	// as; at least 2.
	Replicas int `json:"replicas"`
}

// ReplicatedDevices is a ReplicatedResource's devices key: all, a count
// or a list. Its value is checked by Validate, which names the key.
type ReplicatedDevices struct {
	// All, Count and List are the parsed value: one of them is set.
	All   bool
	Count int
	List  []string
	// raw is the value as written; set means it was given.
	raw json.RawMessage
}

// UnmarshalJSON keeps the value for Validate, which parses it naming the
// key.
func (d *ReplicatedDevices) UnmarshalJSON(b []byte) error {
	d.raw = append(json.RawMessage(nil), b...)
	return nil
}

// Equal reports whether d and o are the same parsed value (go-cmp uses
// it).
func (d ReplicatedDevices) Equal(o ReplicatedDevices) bool {
	return d.All == o.All && d.Count == o.Count && slices.Equal(d.List, o.List)
}

// MarshalJSON writes the value back as it was parsed.
func (d ReplicatedDevices) MarshalJSON() ([]byte, error) {
	switch {
	case d.Count > 0:
		return json.Marshal(d.Count)
	case d.List != nil:
		return json.Marshal(d.List)
	}
	return json.Marshal("all")
}

// Sharing strategies, as NVIDIA's device plugin names them.
const (
	StrategyTimeSlicing = sharing.TimeSlicing
	StrategyMPS         = sharing.MPS
)

// Allocation policies of replicas (sharedDevicesAllocationPolicy).
const (
	// PolicyDistributed prefers the GPUs with the fewest replicas given
	// out, spreading containers over the GPUs.
	PolicyDistributed = "distributed"
	// PolicyPacked prefers the GPUs with the most replicas given out,
	// filling one GPU before the next.
	PolicyPacked = "packed"
)

// Bounds and defaults of the sharing keys.
const (
	// MaxReplicas bounds replicas under timeSlicing: 8 GPUs advertise
	// at most 8192 devices.
	MaxReplicas = 1024
	// MaxMPSReplicas is the most clients an MPS server takes on Volta
	// and later GPUs (16 before Volta), as NVIDIA's device plugin
	// checks.
	MaxMPSReplicas = 48
	// MaxReplicatedResources bounds sharing.*.resources and a devices
	// list.
	MaxReplicatedResources = 256
	// DefaultSharedSuffix is what renameByDefault appends.
	DefaultSharedSuffix = ".shared"
	// DefaultMPSRoot is devicePlugin.mpsRoot's default: the host
	// directory that holds each MPS GPU's pipe and log directories.
	DefaultMPSRoot = "/run/nri-gpu/mps"
	// maxMPSRoot bounds mpsRoot's length so that a daemon's control
	// socket, <mpsRoot>/<GPU UUID>/pipe/control, fits in a unix socket
	// address (107 bytes).
	maxMPSRoot = 107 - len("/GPU-00000000-0000-0000-0000-000000000000/pipe/control")
)

// Strategy returns the sharing strategy in use ("" for none) and its
// resources.
func (s DeviceSharing) Strategy() (string, *ReplicatedResources) {
	switch {
	case s.MPS != nil:
		return StrategyMPS, s.MPS
	case s.TimeSlicing != nil:
		return StrategyTimeSlicing, s.TimeSlicing
	}
	return "", nil
}

// FailGreaterThanOne reports failRequestsGreaterThanOne with its default
// (set by setDefaults).
func (r *ReplicatedResources) FailGreaterThanOne() bool {
	return r != nil && r.FailRequestsGreaterThanOne != nil && *r.FailRequestsGreaterThanOne
}

// SharedName returns the resource an entry's replicas are advertised as.
func (r ReplicatedResource) SharedName() string {
	if r.Rename != "" {
		return r.Rename
	}
	return r.Name
}

func (s *DeviceSharing) setDefaults() {
	for strategy, rr := range map[string]*ReplicatedResources{StrategyTimeSlicing: s.TimeSlicing, StrategyMPS: s.MPS} {
		if rr == nil {
			continue
		}
		if rr.FailRequestsGreaterThanOne == nil {
			fail := strategy == StrategyMPS
			rr.FailRequestsGreaterThanOne = &fail
		}
		for i := range rr.Resources {
			r := &rr.Resources[i]
			if rr.RenameByDefault && r.Rename == "" {
				r.Rename = r.Name + DefaultSharedSuffix
			}
		}
	}
}

// validateSharing checks devicePlugin.sharing, sharedDevicesAllocationPolicy
// and mpsRoot against the rest of d.
func (d DevicePlugin) validateSharing() error {
	switch d.SharedDevicesAllocationPolicy {
	case PolicyDistributed, PolicyPacked:
	default:
		return fmt.Errorf("key devicePlugin.sharedDevicesAllocationPolicy: unknown policy %q (valid: %s, %s)", d.SharedDevicesAllocationPolicy, PolicyDistributed, PolicyPacked)
	}
	if err := checkCacheDir("devicePlugin.mpsRoot", d.MPSRoot); err != nil {
		return err
	}
	if err := checkPath("devicePlugin.mpsRoot", d.MPSRoot); err != nil {
		return err
	}
	if len(d.MPSRoot) > maxMPSRoot || strings.ContainsAny(d.MPSRoot, ":,\x00") {
		return fmt.Errorf("key devicePlugin.mpsRoot: %q must be at most %d bytes (an MPS daemon's control socket, <mpsRoot>/<GPU UUID>/pipe/control, must fit in a unix socket address) without ':' or ','", d.MPSRoot, maxMPSRoot)
	}
	s := d.Sharing
	if s.TimeSlicing != nil && s.MPS != nil {
		return fmt.Errorf("keys devicePlugin.sharing.timeSlicing and devicePlugin.sharing.mps: a node shares its GPUs one way; keep one of them")
	}
	strategy, rr := s.Strategy()
	if rr == nil {
		return nil
	}
	key := "devicePlugin.sharing.timeSlicing"
	if strategy == StrategyMPS {
		key = "devicePlugin.sharing.mps"
		if d.MIGStrategy != MIGStrategyNone {
			return fmt.Errorf("key %s: MPS does not share MIG devices, and devicePlugin.migStrategy %s advertises them; use migStrategy: none, or sharing.timeSlicing", key, d.MIGStrategy)
		}
	}
	if !d.Enabled {
		return fmt.Errorf("key %s: replicas are handed out by the device plugin, which is off; set devicePlugin.enabled: true", key)
	}
	return d.validateReplicated(key, strategy, rr)
}

// validateReplicated checks the resources of one strategy: each names a
// resource the device plugin serves, once, with a valid rename that no
// other resource has, and replicas and devices in bounds.
func (d DevicePlugin) validateReplicated(key, strategy string, rr *ReplicatedResources) error {
	if len(rr.Resources) == 0 {
		return fmt.Errorf("key %s.resources: no resources (name the resource to share, such as %s)", key, d.ResourceName)
	}
	if len(rr.Resources) > MaxReplicatedResources {
		return fmt.Errorf("key %s.resources: %d resources (at most %d)", key, len(rr.Resources), MaxReplicatedResources)
	}
	maxReplicas := MaxReplicas
	if strategy == StrategyMPS {
		maxReplicas = MaxMPSReplicas
	}
	names := map[string]string{d.ResourceName: "devicePlugin.resourceName"}
	for i, r := range rr.Resources {
		at := fmt.Sprintf("%s.resources[%d]", key, i)
		if err := d.servedResource(at+".name", r.Name); err != nil {
			return err
		}
		if prev, dup := names["name "+r.Name]; dup {
			return fmt.Errorf("key %s.name: %s is replicated twice (also %s)", at, r.Name, prev)
		}
		names["name "+r.Name] = at
		if r.Replicas < 2 || r.Replicas > maxReplicas {
			return fmt.Errorf("key %s.replicas: %d (valid: 2 to %d under %s)", at, r.Replicas, maxReplicas, strategy)
		}
		if err := r.Devices.check(at + ".devices"); err != nil {
			return err
		}
		if r.Rename == "" || r.Rename == r.Name {
			continue
		}
		if why := extendedResourceProblem(r.Rename); why != "" {
			return fmt.Errorf("key %s.rename: %q is not an extended resource name such as %s%s: %s", at, r.Rename, r.Name, DefaultSharedSuffix, why)
		}
		if p, ok := strings.CutPrefix(r.Rename, MIGResourcePrefix); ok && migProfile.MatchString(p) || r.Rename == d.ResourceName {
			return fmt.Errorf("key %s.rename: %s is a resource the device plugin serves itself (%s, %s<profile>); choose another name, such as %s%s", at, r.Rename, d.ResourceName, MIGResourcePrefix, r.Name, DefaultSharedSuffix)
		}
		if prev, dup := names[r.Rename]; dup {
			return fmt.Errorf("key %s.rename: %s is also %s", at, r.Rename, prev)
		}
		names[r.Rename] = at + ".rename"
		if len(filepath.Join(d.SocketDir, DevicePluginSocketName(r.Rename))) > 107 {
			return fmt.Errorf("key %s.rename: %q: the device plugin's socket path in %s would be longer than a unix socket allows (107 bytes)", at, r.Rename, d.SocketDir)
		}
	}
	return nil
}

// MIGResourcePrefix starts the resource of a MIG profile under migStrategy
// mixed: nvidia.com/mig-1g.10gb, as NVIDIA's device plugin names it.
const MIGResourcePrefix = sharing.MIGResourcePrefix

// SharingSpec returns what the node's sharing plan is made from
// (sharing.NewPlan): these keys as plain values.
func (d DevicePlugin) SharingSpec() sharing.Spec {
	spec := sharing.Spec{ResourceName: d.ResourceName, MIGStrategy: d.MIGStrategy, Policy: d.SharedDevicesAllocationPolicy, MPSRoot: d.MPSRoot}
	if len(d.Devices) > 0 {
		list := DeviceList(d.Devices)
		spec.Offered = func(g inventory.GPU) bool { return list.Matches(g, parentOf(g)) }
	}
	strategy, rr := d.Sharing.Strategy()
	if rr == nil {
		return spec
	}
	spec.Strategy, spec.FailRequestsGreaterThanOne = strategy, rr.FailGreaterThanOne()
	key := "devicePlugin.sharing.timeSlicing"
	if strategy == StrategyMPS {
		key = "devicePlugin.sharing.mps"
	}
	for i, r := range rr.Resources {
		spec.Resources = append(spec.Resources, sharing.Resource{Name: r.Name, SharedName: r.SharedName(), Replicas: r.Replicas,
			Count: r.Devices.Count, List: slices.Clone(r.Devices.List), Key: fmt.Sprintf("%s.resources[%d].devices", key, i)})
	}
	return spec
}

// migProfile matches a MIG profile name as NVML names them
// (1g.10gb, 1c.2g.20gb, 1g.10gb+me).
var migProfile = regexp.MustCompile(`^([0-9]+c\.)?[0-9]+g\.[0-9]+gb(\+[a-z]+)?$`)

// servedResource checks that name (the value of key) is a resource the
// device plugin serves under its migStrategy.
func (d DevicePlugin) servedResource(key, name string) error {
	if name == d.ResourceName {
		return nil
	}
	if p, ok := strings.CutPrefix(name, MIGResourcePrefix); ok && migProfile.MatchString(p) {
		if d.MIGStrategy == MIGStrategyMixed {
			return nil
		}
		return fmt.Errorf("key %s: %s is a MIG profile's resource, which only migStrategy mixed advertises (devicePlugin.migStrategy is %s)", key, name, d.MIGStrategy)
	}
	valid := d.ResourceName
	if d.MIGStrategy == MIGStrategyMixed {
		valid += ", " + MIGResourcePrefix + "<profile> (such as " + MIGResourcePrefix + "1g.10gb)"
	}
	return fmt.Errorf("key %s: %q is not a resource the device plugin serves (valid: %s)", key, name, valid)
}

// deviceRef matches an entry of a devices list: a GPU index, a
// <gpu>:<mig> MIG index, a GPU UUID or a MIG UUID (either form NVML
// prints).
var deviceRef = regexp.MustCompile(`^([0-9]{1,3}|[0-9]{1,3}:[0-9]{1,2}|GPU-[0-9a-fA-F-]{36}|MIG-[0-9a-fA-F-]{36}|MIG-GPU-[0-9a-fA-F-]{36}/[0-9]{1,2}/[0-9]{1,2})$`)

// parseDevices reads the devices value of every replicated resource;
// its errors name the key.
func (s *DeviceSharing) parseDevices() error {
	for key, rr := range map[string]*ReplicatedResources{"devicePlugin.sharing.timeSlicing": s.TimeSlicing, "devicePlugin.sharing.mps": s.MPS} {
		if rr == nil {
			continue
		}
		for i := range rr.Resources {
			if err := rr.Resources[i].Devices.parse(fmt.Sprintf("%s.resources[%d].devices", key, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// parse reads the value as written into All, Count or List; its errors
// name key. A value built in Go (no raw value) is kept; none at all is
// all.
func (d *ReplicatedDevices) parse(key string) error {
	raw := d.raw
	d.raw = nil
	if raw == nil {
		if !d.All && d.Count == 0 && d.List == nil {
			d.All = true
		}
		return nil
	}
	*d = ReplicatedDevices{}
	if string(raw) == "null" {
		d.All = true
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s != "all" {
			return fmt.Errorf("key %s: %q (valid: all, a count such as 2, or a list of GPU indexes, <gpu>:<mig> indexes and UUIDs)", key, quoteCut(s))
		}
		d.All = true
		return nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		c, err := strconv.Atoi(n.String())
		if err != nil || c <= 0 || c > MaxReplicatedResources {
			return fmt.Errorf("key %s: %s is not a count of devices (valid: 1 to %d)", key, quoteCut(n.String()), MaxReplicatedResources)
		}
		d.Count = c
		return nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("key %s: expected all, a count or a list", key)
	}
	if len(list) == 0 || len(list) > MaxReplicatedResources {
		return fmt.Errorf("key %s: a list of %d devices (valid: 1 to %d)", key, len(list), MaxReplicatedResources)
	}
	d.List = make([]string, 0, len(list))
	for _, e := range list {
		var ref string
		if json.Unmarshal(e, &n) == nil {
			ref = n.String()
		} else if json.Unmarshal(e, &ref) != nil {
			ref = string(e)
		}
		d.List = append(d.List, ref)
	}
	return nil
}

// check checks a parsed value: exactly one form, a count and a list in
// bounds, every list entry a device reference.
func (d ReplicatedDevices) check(key string) error {
	forms := 0
	for _, set := range []bool{d.All, d.Count != 0, d.List != nil} {
		if set {
			forms++
		}
	}
	switch {
	case forms != 1:
		return fmt.Errorf("key %s: one of all, a count or a list", key)
	case d.Count < 0 || d.Count > MaxReplicatedResources:
		return fmt.Errorf("key %s: %d is not a count of devices (valid: 1 to %d)", key, d.Count, MaxReplicatedResources)
	case d.List != nil && (len(d.List) == 0 || len(d.List) > MaxReplicatedResources):
		return fmt.Errorf("key %s: a list of %d devices (valid: 1 to %d)", key, len(d.List), MaxReplicatedResources)
	}
	seen := map[string]bool{}
	for i, ref := range d.List {
		if !deviceRef.MatchString(ref) {
			return fmt.Errorf("key %s[%d]: %q is not a GPU index, a <gpu>:<mig> MIG index or a GPU or MIG UUID", key, i, quoteCut(ref))
		}
		if seen[strings.ToLower(ref)] {
			return fmt.Errorf("key %s[%d]: %s is listed twice", key, i, ref)
		}
		seen[strings.ToLower(ref)] = true
	}
	return nil
}

// quoteCut cuts s for a message.
func quoteCut(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// parentOf returns the GPU of MIG unit g (a unit carries its parent's
// fields but for its index and UUID), or g itself.
func parentOf(g inventory.GPU) inventory.GPU {
	if g.MIG == nil {
		return g
	}
	p := g
	p.Index, p.UUID, p.MIG = g.MIG.Parent, g.MIG.ParentUUID, nil
	return p
}
