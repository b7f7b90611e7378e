package dra

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// MIG made on demand (dra.dynamicMIG), published as partitionable devices
// (KEP-4815) in the shape NVIDIA's DRA driver gives them with its
// DynamicMIG gate: per GPU one counter set gpu-<minor>-counter-set with a
// counter per capacity (the largest any profile has) and one per memory
// slice (memory-slice-<n>, 1 each); the GPU gpu-<minor> consumes it all;
// every placement of every profile is a device
// gpu-<minor>-mig-<profile>-<profile id>-<start> consuming its profile's
// capacities and its memory slices. Two devices that cannot both exist
// on the GPU always want some counter more than the set has, so the
// scheduler never allocates them together.

// PartitionableGate is the Kubernetes feature gate of counter sets and
// devices consuming them (beta and on by default in 1.37, alpha and off
// in 1.34).
const PartitionableGate = "DRAPartitionableDevices"

// maxCounterSliceSets is how many counter sets one ResourceSlice holds
// (resource.k8s.io/v1's ResourceSliceMaxCounterSets); maxConsumingDevices
// how many devices one slice holds when they consume counters
// (ResourceSliceMaxDevicesWithAdvancedFeatures).
const (
	maxCounterSliceSets = resourceapi.ResourceSliceMaxCounterSets
	maxConsumingDevices = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
)

// counterSetName is NVIDIA's name of a GPU's counter set.
func counterSetName(g inventory.GPU) string { return fmt.Sprintf("gpu-%d-counter-set", g.Minor) }

// memSliceCounter is NVIDIA's name of memory slice i's counter.
func memSliceCounter(i int) string { return "memory-slice-" + strconv.Itoa(i) }

// profileCounters are the counters a profile consumes besides its memory
// slices: NVIDIA's capacities of a MIG device, named as counters (DNS
// labels: copyEngines is copy-engines).
func profileCounters(p nvml.ProfilePlacements) map[string]resourceapi.Counter {
	q := func(v int64) resourceapi.Counter {
		return resourceapi.Counter{Value: *resource.NewQuantity(v, resource.BinarySI)}
	}
	e := p.Engines
	return map[string]resourceapi.Counter{
		"multiprocessors": q(int64(e.Multiprocessors)), "copy-engines": q(int64(e.CopyEngines)),
		"decoders": q(int64(e.Decoders)), "encoders": q(int64(e.Encoders)), "jpeg-engines": q(int64(e.JPEGs)),
		"ofa-engines": q(int64(e.OFAs)), "memory": q(int64(p.MemoryMiB) << 20),
	}
}

// withMemSlices returns c with a counter of 1 for each memory slice of r.
func withMemSlices(c map[string]resourceapi.Counter, r nvml.Range) map[string]resourceapi.Counter {
	for i := r.Start; i < r.Start+r.Size; i++ {
		c[memSliceCounter(i)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.BinarySI)}
	}
	return c
}

// gpuCounters are a GPU's counters: the largest value of each capacity
// among its profiles, and its memory slices (as many as the largest
// placement spans).
func gpuCounters(profiles []nvml.ProfilePlacements) map[string]resourceapi.Counter {
	out := map[string]resourceapi.Counter{}
	slices := 0
	for _, p := range profiles {
		for k, v := range profileCounters(p) {
			if have, ok := out[k]; !ok || v.Value.Cmp(have.Value) > 0 {
				out[k] = v
			}
		}
		for _, r := range p.Placements {
			slices = max(slices, r.Start+r.Size)
		}
	}
	return withMemSlices(out, nvml.Range{Start: 0, Size: slices})
}

// partitions returns GPU g's counter set and its devices made on demand:
// g whole (base, as sliceDevice makes it, with the GPU's largest
// capacities), unless it is in MIG mode for good (!migToggles), and
// every placement of every profile, all consuming the set. nil when NVML
// gave no profile.
func partitions(g inventory.GPU, base resourceapi.Device, profiles []nvml.ProfilePlacements, snap *inventory.Snapshot, root topology) (*resourceapi.CounterSet, []resourceapi.Device) {
	if len(profiles) == 0 {
		return nil, nil
	}
	set := &resourceapi.CounterSet{Name: counterSetName(g), Counters: gpuCounters(profiles)}
	whole := base
	whole.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	for k, v := range set.Counters {
		if name, ok := capacityName[k]; ok {
			whole.Capacity[resourceapi.QualifiedName(NVIDIADomain+"/"+name)] = resourceapi.DeviceCapacity{Value: v.Value}
		}
	}
	whole.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set.Name, Counters: gpuCounters(profiles)}}
	var devs []resourceapi.Device
	if !g.MIGEnabled || migToggles(g) {
		devs = append(devs, whole)
	}
	for _, p := range profiles {
		for _, r := range p.Placements {
			m := &inventory.MIGDevice{Parent: g.Index, ParentUUID: g.UUID, Profile: p.Name, MemoryMiB: p.MemoryMiB,
				Engines: inventory.MIGEngines(p.Engines)}
			u := inventory.GPU{Index: g.Index, Minor: g.Minor, MIG: m}
			name := partitionName(g, p.Name, p.ID, r.Start)
			dv := sliceDevice(unit{name: name, gpu: u, parent: g}, snap, root, base.Taints)
			dv.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set.Name, Counters: withMemSlices(profileCounters(p), r)}}
			devs = append(devs, dv)
		}
	}
	return set, devs
}

// capacityName maps a counter to the capacity of the same quantity.
var capacityName = map[string]string{
	"multiprocessors": "multiprocessors", "copy-engines": "copyEngines", "decoders": "decoders", "encoders": "encoders",
	"jpeg-engines": "jpegEngines", "ofa-engines": "ofaEngines", "memory": "memory",
}

// partitionName is NVIDIA's name of a MIG device (deviceName's form).
func partitionName(g inventory.GPU, profile string, profileID, start int) string {
	return fmt.Sprintf("gpu-%d-mig-%s-%d-%d", g.Minor, migNamePart(profile), profileID, start)
}

// partitionNameRE reads a partitionName: the GPU's minor, the profile id
// and the placement's start.
var partitionNameRE = regexp.MustCompile(`^gpu-(\d{1,4})-mig-[a-z0-9-]{1,40}-(\d{1,3})-(\d{1,2})$`)

// dynamicGPUs returns the GPUs of st whose MIG devices are made on
// demand: in dra.dynamicMIG.devices, published by DRA, and in MIG mode
// or of an architecture whose MIG mode nri-gpu switches (migToggles).
func dynamicGPUs(st *node.State) []inventory.GPU {
	if st == nil || st.Source.Problem() != "" || !st.Config.DRA.DynamicMIG.Enabled() {
		return nil
	}
	var out []inventory.GPU
	for _, g := range st.Snapshot().GPUs {
		if (g.MIGEnabled || migToggles(g)) && g.UUID != "" && st.Config.DRA.DynamicMIG.Has(g) && isDRAGPU(st, g) {
			out = append(out, g)
		}
	}
	return out
}

// togglingArchitectures are the architectures whose MIG mode changes
// without a GPU reset (go-nvlib's names): Hopper and later, as NVIDIA's
// DRA driver decides (supportsMIGModeToggle, arch >= Hopper).
var togglingArchitectures = []string{"Hopper", "Blackwell", "Rubin"}

// migToggles reports whether g's MIG mode can be switched on for its
// first MIG device and off after its last, with no GPU reset: NVML
// says it is of a togglingArchitectures. An A100 (Ampere) cannot: a
// change waits for a reset, so such a GPU is made on demand only while an
// operator keeps it in MIG mode, and is then never published whole.
func migToggles(g inventory.GPU) bool {
	return g.Props != nil && slices.Contains(togglingArchitectures, g.Props.Architecture)
}

// isDRAGPU reports whether DRA publishes GPU g, as units decides it:
// dra.devices (all without it), and not the device plugin's.
func isDRAGPU(st *node.State, g inventory.GPU) bool {
	cfg := st.Config
	var dp config.DeviceList
	if cfg.DevicePlugin.Enabled {
		dp = config.DeviceList(cfg.DevicePlugin.Devices)
	}
	return config.DeviceList(cfg.DRA.Devices).Matches(g, g) && (dp == nil || !dp.Matches(g, g))
}

// partitionsOf returns the counter sets of st's GPUs whose MIG devices
// are made on demand and, by GPU UUID, their devices (partitions); none
// once the API server turned out to have no partitionable devices. The
// caller holds mu.
func (d *Driver) partitionsOf(st *node.State) ([]resourceapi.CounterSet, map[string][]resourceapi.Device) {
	gpus := dynamicGPUs(st)
	if len(gpus) == 0 || d.noPartitions.Load() {
		return nil, nil
	}
	snap := st.Snapshot()
	var sets []resourceapi.CounterSet
	parts := map[string][]resourceapi.Device{}
	for _, g := range gpus {
		taints := taintsFor(st.Unhealthy[g.UUID])
		if taints != nil && d.noTaints.Load() {
			continue
		}
		base := sliceDevice(unit{name: deviceName(g, g), gpu: g, parent: g}, snap, d.pcieRoot, taints)
		set, devs := partitions(g, base, d.migProfiles(g.UUID), snap, d.pcieRoot)
		if set == nil {
			continue
		}
		sets = append(sets, *set)
		parts[g.UUID] = devs
	}
	return sets, parts
}

// migProfiles returns GPU uuid's MIG profiles and placements, asked of
// NVML once per GPU; none without NVML (logged once). The caller holds mu.
func (d *Driver) migProfiles(uuid string) []nvml.ProfilePlacements {
	if p, ok := d.profiles[uuid]; ok {
		return p
	}
	var p []nvml.ProfilePlacements
	var err error
	if d.opts.MIG == nil {
		err = fmt.Errorf("NVML cannot make MIG devices on this node")
	} else {
		p, err = d.opts.MIG.Profiles(uuid)
	}
	if err != nil {
		d.log.WithField("gpu", uuid).WithError(err).Warn("DRA: dra.dynamicMIG: the GPU's MIG profiles are unknown; it is not published")
	}
	if d.profiles == nil {
		d.profiles = map[string][]nvml.ProfilePlacements{}
	}
	d.profiles[uuid] = p
	return p
}

// partitionSlices lays out the counter sets and partitions: slices of
// counter sets alone (the API allows a slice one or the other), then
// each GPU's partitions in slices of their own.
func partitionSlices(sets []resourceapi.CounterSet, parts map[string][]resourceapi.Device) []resourceslice.Slice {
	var out []resourceslice.Slice
	for len(sets) > 0 {
		n := min(len(sets), maxCounterSliceSets)
		out = append(out, resourceslice.Slice{SharedCounters: sets[:n]})
		sets = sets[n:]
	}
	for _, uuid := range slices.Sorted(maps.Keys(parts)) {
		devs := parts[uuid]
		for len(devs) > 0 {
			n := min(len(devs), maxConsumingDevices)
			out = append(out, resourceslice.Slice{Devices: devs[:n]})
			devs = devs[n:]
		}
	}
	return out
}
