package nvml

import "fmt"

// MIG made on demand: the GPU instance profiles of a GPU with every
// placement they can take (what a driver publishes for the scheduler to
// choose from), and the creation and destruction of a GPU instance with
// one compute instance spanning it (a MIG device), as NVIDIA's DRA driver
// does with its DynamicMIG gate. Every function is optional in the
// library; without one, MIGMaker's calls fail and Profiles returns none.

// ProfilePlacements is a GPU instance profile and where its instances can
// lie (nvmlDeviceGetGpuInstancePossiblePlacements_v2).
type ProfilePlacements struct {
	// Name is go-nvlib's ("1g.10gb", "1g.10gb+me"); ID the profile's
	// id (19 for an H100's 1g.10gb).
	Name string
	ID   int
	// Slices are its compute slices (of 7), MemoryMiB its memory.
	Slices    int
	MemoryMiB uint64
	Engines   Engines
	// Placements are where an instance can lie, in memory slices.
	Placements []Range
}

// Range is a run of memory slices: Size from Start.
type Range struct{ Start, Size int }

// Instance is a GPU instance made on demand, with its compute instance
// when it has one (CI < 0 without; a GPU instance alone is what a crash
// between the two creations leaves).
type Instance struct {
	GI, CI    int
	ProfileID int
	Placement Range
	// UUID is the MIG device's ("MIG-..."), empty without a compute
	// instance.
	UUID string
}

// MIGMaker is implemented by the Lib that Open returns: MIG devices made
// and destroyed on a GPU in MIG mode, by the GPU's UUID. Creating and
// destroying need root, as with nvidia-smi mig.
type MIGMaker interface {
	// Profiles returns the GPU's GPU instance profiles whose compute
	// instance spans the GPU instance, with their placements.
	Profiles(gpuUUID string) ([]ProfilePlacements, error)
	// CreateMIG creates a GPU instance of profile profileID at place
	// and a compute instance spanning it; on failure nothing is left.
	CreateMIG(gpuUUID string, profileID int, place Range) (Instance, error)
	// DestroyMIG destroys compute instance ci (none when ci < 0) and
	// then GPU instance gi; an instance already gone is no error.
	DestroyMIG(gpuUUID string, gi, ci int) error
	// Instances lists the GPU's GPU instances with their compute
	// instances (one Instance per compute instance; one with CI -1 for
	// a GPU instance without any); none when MIG mode is off.
	Instances(gpuUUID string) ([]Instance, error)
	// SetMIGMode switches the GPU's MIG mode on or off
	// (nvmlDeviceSetMigMode), as NVIDIA's DRA driver does for its
	// DynamicMIG GPUs: refused while the GPU has a GPU instance or a
	// process; an error too when the change waits for a GPU reset (before
	// Hopper), which leaves the mode as it was.
	SetMIGMode(gpuUUID string, on bool) error
}

// computeInstanceProfileInfo is nvmlComputeInstanceProfileInfo_t: 36
// bytes.
type computeInstanceProfileInfo struct {
	ID, SliceCount, InstanceCount, MultiprocessorCount                                        uint32
	SharedCopyEngineCount, SharedDecoderCount, SharedEncoderCount, SharedJpegCount, SharedOfa uint32
}

// computeInstanceInfo is nvmlComputeInstanceInfo_t: 32 bytes.
type computeInstanceInfo struct {
	Device, GPUInstance uintptr
	ID, ProfileID       uint32
	Start, Size         uint32
}

// ciProfileCount is NVML_COMPUTE_INSTANCE_PROFILE_COUNT; ciProfile1SliceRev1
// is the one NVIDIA's driver skips (NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1).
const (
	ciProfileCount      = 0x9
	ciProfile1SliceRev1 = 0x7
)

// ErrInUse and ErrInsufficientResources are NVML_ERROR_IN_USE (a GPU
// instance with compute instances) and NVML_ERROR_INSUFFICIENT_RESOURCES
// (a placement that overlaps one taken).
const (
	ErrInUse                 Return = 19
	ErrInsufficientResources Return = 23
)

// migFuncs are the functions of MIG made on demand, bound on first use.
type migFuncs struct {
	bound         bool
	err           error
	placements    func(uintptr, uint32, *placement32, *uint32) Return
	createGI      func(uintptr, uint32, *placement32, *uintptr) Return
	getGIs        func(uintptr, uint32, *uintptr, *uint32) Return
	ciProfileInfo func(uintptr, uint32, uint32, *computeInstanceProfileInfo) Return
	createCI      func(uintptr, uint32, *uintptr) Return
	ciByID        func(uintptr, uint32, *uintptr) Return
	ciInfo        func(uintptr, *computeInstanceInfo) Return
	destroyCI     func(uintptr) Return
	destroyGI     func(uintptr) Return
	setMode       func(uintptr, uint32, *Return) Return
}

// placement32 is nvmlGpuInstancePlacement_t: 8 bytes.
type placement32 struct{ Start, Size uint32 }

// migHandle binds the functions if needed and returns GPU uuid's handle.
// The caller holds l.mu.
func (l *dl) migHandle(uuid string) (uintptr, error) {
	h, err := l.handleByUUID(uuid)
	if err != nil {
		return 0, err
	}
	f := &l.make
	if !f.bound {
		f.bound = true
		for _, s := range []struct {
			ptr  any
			name string
		}{
			{&f.placements, "nvmlDeviceGetGpuInstancePossiblePlacements_v2"},
			{&f.createGI, "nvmlDeviceCreateGpuInstanceWithPlacement"},
			{&f.getGIs, "nvmlDeviceGetGpuInstances"},
			{&f.ciProfileInfo, "nvmlGpuInstanceGetComputeInstanceProfileInfo"},
			{&f.createCI, "nvmlGpuInstanceCreateComputeInstance"},
			{&f.ciByID, "nvmlGpuInstanceGetComputeInstanceById"},
			{&f.ciInfo, "nvmlComputeInstanceGetInfo_v2"},
			{&f.destroyCI, "nvmlComputeInstanceDestroy"},
			{&f.destroyGI, "nvmlGpuInstanceDestroy"},
			{&f.setMode, "nvmlDeviceSetMigMode"},
		} {
			if err := l.sym(s.ptr, s.name, true); err != nil {
				f.err = fmt.Errorf("nvml: MIG on demand: %w", err)
				break
			}
		}
		if l.props.getGIProfileInfo == nil || l.props.getGIByID == nil || l.props.getGIInfo == nil {
			f.err = fmt.Errorf("nvml: MIG on demand: the library has no GPU instance profiles")
		}
	}
	return h, f.err
}

// Profiles implements MIGMaker.
func (l *dl) Profiles(gpuUUID string) ([]ProfilePlacements, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, err := l.migHandle(gpuUUID)
	if err != nil {
		return nil, err
	}
	var mem memory
	if l.getMemoryInfo != nil {
		_ = l.getMemoryInfo(h, &mem)
	}
	var out []ProfilePlacements
	for _, p := range l.giProfiles(h) {
		var buf [8]placement32
		n := uint32(len(buf))
		if r := l.make.placements(h, p.info.ID, &buf[0], &n); r != Success {
			if r == ErrNotSupported || r == ErrInvalidArg {
				continue // as NVIDIA's driver skips them
			}
			return nil, l.err("nvmlDeviceGetGpuInstancePossiblePlacements_v2", r)
		}
		pi := p.info
		pp := ProfilePlacements{
			Name: profileName(p.index, int(pi.SliceCount), 0, pi.MemorySizeMB, mem.Total>>20), ID: int(pi.ID),
			Slices: int(pi.SliceCount), MemoryMiB: pi.MemorySizeMB,
			Engines: Engines{Multiprocessors: pi.MultiprocessorCount, CopyEngines: pi.CopyEngineCount, Decoders: pi.DecoderCount,
				Encoders: pi.EncoderCount, JPEGs: pi.JpegCount, OFAs: pi.OfaCount},
		}
		for _, r := range buf[:min(n, uint32(len(buf)))] {
			pp.Placements = append(pp.Placements, Range{Start: int(r.Start), Size: int(r.Size)})
		}
		out = append(out, pp)
	}
	return out, nil
}

// fullCIProfile returns the compute instance profile of GPU instance gi
// that spans it: the one with the most slices.
func (l *dl) fullCIProfile(gi uintptr) (uint32, bool) {
	best, slices := uint32(0), uint32(0)
	for i := uint32(0); i < ciProfileCount; i++ {
		var info computeInstanceProfileInfo
		if i == ciProfile1SliceRev1 || l.make.ciProfileInfo(gi, i, 0, &info) != Success {
			continue
		}
		if info.SliceCount > slices {
			best, slices = i, info.SliceCount
		}
	}
	return best, slices > 0
}

// CreateMIG implements MIGMaker.
func (l *dl) CreateMIG(gpuUUID string, profileID int, place Range) (Instance, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, err := l.migHandle(gpuUUID)
	if err != nil {
		return Instance{}, err
	}
	p := placement32{Start: uint32(place.Start), Size: uint32(place.Size)}
	var gi uintptr
	if r := l.make.createGI(h, uint32(profileID), &p, &gi); r != Success {
		return Instance{}, l.err("nvmlDeviceCreateGpuInstanceWithPlacement", r)
	}
	var info gpuInstanceInfo
	if r := l.props.getGIInfo(gi, &info); r != Success {
		_ = l.make.destroyGI(gi)
		return Instance{}, l.err("nvmlGpuInstanceGetInfo", r)
	}
	inst := Instance{GI: int(info.ID), CI: -1, ProfileID: profileID, Placement: place}
	cp, ok := l.fullCIProfile(gi)
	if !ok {
		_ = l.make.destroyGI(gi)
		return Instance{}, fmt.Errorf("nvml: GPU instance %d of %s has no compute instance profile", inst.GI, gpuUUID)
	}
	var ci uintptr
	if r := l.make.createCI(gi, cp, &ci); r != Success {
		_ = l.make.destroyGI(gi)
		return Instance{}, l.err("nvmlGpuInstanceCreateComputeInstance", r)
	}
	var cinfo computeInstanceInfo
	if r := l.make.ciInfo(ci, &cinfo); r != Success {
		_ = l.make.destroyCI(ci)
		_ = l.make.destroyGI(gi)
		return Instance{}, l.err("nvmlComputeInstanceGetInfo_v2", r)
	}
	inst.CI = int(cinfo.ID)
	if inst.UUID, err = l.uuid(cinfo.Device); err != nil {
		_ = l.make.destroyCI(ci)
		_ = l.make.destroyGI(gi)
		return Instance{}, err
	}
	return inst, nil
}

// DestroyMIG implements MIGMaker.
func (l *dl) DestroyMIG(gpuUUID string, gi, ci int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, err := l.migHandle(gpuUUID)
	if err != nil {
		return err
	}
	var gh uintptr
	switch r := l.props.getGIByID(h, uint32(gi), &gh); r {
	case Success:
	case ErrNotFound:
		return nil
	default:
		return l.err("nvmlDeviceGetGpuInstanceById", r)
	}
	if ci >= 0 {
		var ch uintptr
		switch r := l.make.ciByID(gh, uint32(ci), &ch); r {
		case Success:
			if r := l.make.destroyCI(ch); r != Success {
				return l.err("nvmlComputeInstanceDestroy", r)
			}
		case ErrNotFound:
		default:
			return l.err("nvmlGpuInstanceGetComputeInstanceById", r)
		}
		// The handle may not survive the compute instance's end.
		if r := l.props.getGIByID(h, uint32(gi), &gh); r != Success {
			return l.err("nvmlDeviceGetGpuInstanceById", r)
		}
	}
	if r := l.make.destroyGI(gh); r != Success {
		return l.err("nvmlGpuInstanceDestroy", r)
	}
	return nil
}

// maxGIs bounds the GPU instances read per profile (7 on every GPU).
const maxGIs = 8

// Instances implements MIGMaker.
func (l *dl) Instances(gpuUUID string) ([]Instance, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, err := l.migHandle(gpuUUID)
	if err != nil {
		return nil, err
	}
	if on, err := l.migModeOn(h); err != nil || !on {
		return nil, err
	}
	var out []Instance
	for _, p := range l.giProfiles(h) {
		var buf [maxGIs]uintptr
		n := uint32(len(buf))
		if r := l.make.getGIs(h, p.info.ID, &buf[0], &n); r != Success {
			return nil, l.err("nvmlDeviceGetGpuInstances", r)
		}
		// The handles of one call; each instance is read by id after.
		var ids []uint32
		var places []Range
		for _, gh := range buf[:min(n, maxGIs)] {
			var info gpuInstanceInfo
			if r := l.props.getGIInfo(gh, &info); r != Success {
				return nil, l.err("nvmlGpuInstanceGetInfo", r)
			}
			ids = append(ids, info.ID)
			places = append(places, Range{Start: int(info.Start), Size: int(info.Size)})
		}
		for k, id := range ids {
			var gh uintptr
			if r := l.props.getGIByID(h, id, &gh); r != Success {
				return nil, l.err("nvmlDeviceGetGpuInstanceById", r)
			}
			found := false
			for c := uint32(0); c < 8; c++ {
				var ch uintptr
				if l.make.ciByID(gh, c, &ch) != Success {
					continue
				}
				var ci computeInstanceInfo
				if r := l.make.ciInfo(ch, &ci); r != Success {
					return nil, l.err("nvmlComputeInstanceGetInfo_v2", r)
				}
				uuid, err := l.uuid(ci.Device)
				if err != nil {
					return nil, err
				}
				out = append(out, Instance{GI: int(id), CI: int(c), ProfileID: int(p.info.ID), Placement: places[k], UUID: uuid})
				found = true
			}
			if !found {
				out = append(out, Instance{GI: int(id), CI: -1, ProfileID: int(p.info.ID), Placement: places[k]})
			}
		}
	}
	return out, nil
}

var _ MIGMaker = (*dl)(nil)

// migModeOn reports whether GPU h is in MIG mode now. The caller holds
// l.mu.
func (l *dl) migModeOn(h uintptr) (bool, error) {
	if l.getMigMode == nil {
		return false, fmt.Errorf("nvml: the library has no nvmlDeviceGetMigMode")
	}
	var cur, pending uint32
	switch r := l.getMigMode(h, &cur, &pending); r {
	case Success:
		return cur == 1, nil
	case ErrNotSupported:
		return false, nil
	default:
		return false, l.err("nvmlDeviceGetMigMode", r)
	}
}

// SetMIGMode implements MIGMaker.
func (l *dl) SetMIGMode(gpuUUID string, on bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, err := l.migHandle(gpuUUID)
	if err != nil {
		return err
	}
	if cur, err := l.migModeOn(h); err != nil || cur == on {
		return err
	}
	mode := uint32(0)
	if on {
		mode = 1
	}
	var activation Return
	if r := l.make.setMode(h, mode, &activation); r != Success {
		return l.err("nvmlDeviceSetMigMode", r)
	}
	if activation != Success {
		// Set, but not in effect: pending a GPU reset (an A100), or
		// refused by a client of the GPU.
		return l.err("nvmlDeviceSetMigMode (activation)", activation)
	}
	if now, err := l.migModeOn(h); err != nil || now != on {
		if err == nil {
			err = fmt.Errorf("nvml: GPU %s: MIG mode %s was accepted but is not in effect", gpuUUID, map[bool]string{true: "on", false: "off"}[on])
		}
		return err
	}
	return nil
}
