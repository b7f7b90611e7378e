package nvml

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Struct layouts of nvml.h (checked against NVIDIA's header: the sizes are
// asserted in layout_test.go and by the simulated library's C source).

// pciInfo is nvmlPciInfo_t (the _v3 layout): 68 bytes.
type pciInfo struct {
	BusIDLegacy    [16]byte
	Domain         uint32
	Bus            uint32
	Device         uint32
	PCIDeviceID    uint32
	PCISubSystemID uint32
	BusID          [32]byte
}

// attributes is nvmlDeviceAttributes_t: 40 bytes.
type attributes struct {
	MultiprocessorCount       uint32
	SharedCopyEngineCount     uint32
	SharedDecoderCount        uint32
	SharedEncoderCount        uint32
	SharedJpegCount           uint32
	SharedOfaCount            uint32
	GPUInstanceSliceCount     uint32
	ComputeInstanceSliceCount uint32
	MemorySizeMB              uint64
}

// memory is nvmlMemory_t: 24 bytes.
type memory struct {
	Total, Free, Used uint64
}

// eventData is nvmlEventData_t: 32 bytes.
type eventData struct {
	Device            uintptr
	EventType         uint64
	EventData         uint64
	GPUInstanceID     uint32
	ComputeInstanceID uint32
}

// Buffer sizes of nvml.h.
const (
	uuidBufferSize = 96 // NVML_DEVICE_UUID_V2_BUFFER_SIZE
	nameBufferSize = 96 // NVML_DEVICE_NAME_V2_BUFFER_SIZE
)

// EventTypeXidCriticalError is nvmlEventTypeXidCriticalError.
const EventTypeXidCriticalError = 0x8

// MaxMIGDevices bounds the MIG devices read per GPU (7 on every GPU so
// far; NVML's own maximum is 8 GPU instances with up to 8 compute
// instances each).
const MaxMIGDevices = 64

// MaxGPUs bounds the GPUs read.
const MaxGPUs = 256

// dl is Lib over a dlopen'ed libnvidia-ml.so.1.
type dl struct {
	handle uintptr
	// mu serializes Devices with itself; NVML is thread-safe, but
	// the handle map of Events is built from one enumeration. It also
	// guards closed and sets.
	mu sync.Mutex
	// sets are the event sets Events made, freed or not: Close frees
	// those still in use, each once its wait has returned, before it
	// shuts NVML down.
	sets []*events

	errorString             func(Return) string
	shutdown                func() Return
	getCount                func(*uint32) Return
	getHandleByIndex        func(uint32, *uintptr) Return
	getUUID                 func(uintptr, *byte, uint32) Return
	getName                 func(uintptr, *byte, uint32) Return
	getPciInfo              func(uintptr, *pciInfo) Return
	getMemoryInfo           func(uintptr, *memory) Return
	getMigMode              func(uintptr, *uint32, *uint32) Return
	getMaxMigDeviceCount    func(uintptr, *uint32) Return
	getMigDeviceHandleByIdx func(uintptr, uint32, *uintptr) Return
	getGpuInstanceID        func(uintptr, *uint32) Return
	getComputeInstanceID    func(uintptr, *uint32) Return
	getAttributes           func(uintptr, *attributes) Return
	eventSetCreate          func(*uintptr) Return
	registerEvents          func(uintptr, uint64, uintptr) Return
	eventSetWait            func(uintptr, *eventData, uint32) Return
	eventSetFree            func(uintptr) Return
	getSupportedEventTypes  func(uintptr, *uint64) Return
	getNVMLVersion          func(*byte, uint32) Return
	getDriverVersion        func(*byte, uint32) Return
	hasSupportedEventTypes  bool
	hasMemoryInfo           bool
	hasMIG                  bool
	closed                  bool
	// compute are the compute-mode functions, bound on first use
	// (compute.go).
	compute computeFuncs
	// props are the functions of the properties (props.go).
	props propFuncs
	// make are the functions of MIG made on demand, bound on first use
	// (migcreate.go).
	make migFuncs
}

// Open loads the NVML library at path (an absolute path found by
// discovery) and initializes it. The returned Lib holds NVML initialized
// until Close.
func Open(path string) (Lib, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("nvml: %q is not an absolute path", path)
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("nvml: loading %s: %w", path, err)
	}
	l := &dl{handle: h}
	if err := l.bind(); err != nil {
		_ = purego.Dlclose(h)
		return nil, fmt.Errorf("nvml: %s: %w", path, err)
	}
	var initV2 func() Return
	if err := l.sym(&initV2, "nvmlInit_v2", true); err != nil {
		_ = purego.Dlclose(h)
		return nil, fmt.Errorf("nvml: %s: %w", path, err)
	}
	if r := initV2(); r != Success {
		err := l.err("nvmlInit_v2", r)
		_ = purego.Dlclose(h)
		return nil, err
	}
	return l, nil
}

// sym binds *fptr to the library's symbol name; a missing optional symbol
// leaves *fptr nil.
func (l *dl) sym(fptr any, name string, required bool) error {
	addr, err := purego.Dlsym(l.handle, name)
	if err != nil || addr == 0 {
		if required {
			return fmt.Errorf("symbol %s is missing", name)
		}
		return nil
	}
	purego.RegisterFunc(fptr, addr)
	return nil
}

func (l *dl) bind() error {
	type fn struct {
		ptr      any
		name     string
		required bool
	}
	fns := []fn{
		{&l.errorString, "nvmlErrorString", true},
		{&l.shutdown, "nvmlShutdown", true},
		{&l.getCount, "nvmlDeviceGetCount_v2", true},
		{&l.getHandleByIndex, "nvmlDeviceGetHandleByIndex_v2", true},
		{&l.getUUID, "nvmlDeviceGetUUID", true},
		{&l.getName, "nvmlDeviceGetName", true},
		{&l.getPciInfo, "nvmlDeviceGetPciInfo_v3", true},
		{&l.getMemoryInfo, "nvmlDeviceGetMemoryInfo", false},
		{&l.getMigMode, "nvmlDeviceGetMigMode", false},
		{&l.getMaxMigDeviceCount, "nvmlDeviceGetMaxMigDeviceCount", false},
		{&l.getMigDeviceHandleByIdx, "nvmlDeviceGetMigDeviceHandleByIndex", false},
		{&l.getGpuInstanceID, "nvmlDeviceGetGpuInstanceId", false},
		{&l.getComputeInstanceID, "nvmlDeviceGetComputeInstanceId", false},
		{&l.getAttributes, "nvmlDeviceGetAttributes_v2", false},
		{&l.eventSetCreate, "nvmlEventSetCreate", false},
		{&l.registerEvents, "nvmlDeviceRegisterEvents", false},
		{&l.eventSetWait, "nvmlEventSetWait_v2", false},
		{&l.eventSetFree, "nvmlEventSetFree", false},
		{&l.getSupportedEventTypes, "nvmlDeviceGetSupportedEventTypes", false},
		{&l.getNVMLVersion, "nvmlSystemGetNVMLVersion", false},
		{&l.getDriverVersion, "nvmlSystemGetDriverVersion", false},
	}
	for _, f := range fns {
		if err := l.sym(f.ptr, f.name, f.required); err != nil {
			return err
		}
	}
	l.bindProps()
	l.hasMIG = l.getMigMode != nil && l.getMaxMigDeviceCount != nil && l.getMigDeviceHandleByIdx != nil &&
		l.getGpuInstanceID != nil && l.getComputeInstanceID != nil && l.getAttributes != nil
	l.hasMemoryInfo = l.getMemoryInfo != nil
	l.hasSupportedEventTypes = l.getSupportedEventTypes != nil
	return nil
}

func (l *dl) err(fn string, r Return) error {
	e := &Error{Func: fn, Code: r}
	if l.errorString != nil {
		e.Text = l.errorString(r)
	}
	return e
}

// cstring returns the NUL-terminated string at the start of b.
func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func (l *dl) uuid(h uintptr) (string, error) {
	var buf [uuidBufferSize]byte
	if r := l.getUUID(h, &buf[0], uint32(len(buf))); r != Success {
		return "", l.err("nvmlDeviceGetUUID", r)
	}
	return cstring(buf[:]), nil
}

// Devices implements Lib.
func (l *dl) Devices() ([]GPU, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	var n uint32
	if r := l.getCount(&n); r != Success {
		return nil, l.err("nvmlDeviceGetCount_v2", r)
	}
	if n > MaxGPUs {
		return nil, fmt.Errorf("nvml: nvmlDeviceGetCount_v2 reports %d GPUs (more than %d)", n, MaxGPUs)
	}
	cuda := l.cudaDriverVersion()
	gpus := make([]GPU, 0, n)
	for i := uint32(0); i < n; i++ {
		g := l.gpu(i)
		if g.Err == nil {
			g.CUDADriverVersion = cuda
		}
		gpus = append(gpus, g)
	}
	return gpus, nil
}

// gpu queries GPU i; a failure is recorded in GPU.Err.
func (l *dl) gpu(i uint32) GPU {
	g := GPU{Index: int(i)}
	var h uintptr
	if r := l.getHandleByIndex(i, &h); r != Success {
		g.Err = l.err("nvmlDeviceGetHandleByIndex_v2", r)
		return g
	}
	var err error
	if g.UUID, err = l.uuid(h); err != nil {
		g.Err = err
		return g
	}
	var pci pciInfo
	if r := l.getPciInfo(h, &pci); r != Success {
		g.Err = l.err("nvmlDeviceGetPciInfo_v3", r)
		return g
	}
	g.BusID = cstring(pci.BusID[:])
	var name [nameBufferSize]byte
	if r := l.getName(h, &name[0], uint32(len(name))); r == Success {
		g.Name = cstring(name[:])
	}
	if l.hasMemoryInfo {
		var m memory
		if r := l.getMemoryInfo(h, &m); r == Success {
			g.MemoryMiB, g.MemoryBytes = m.Total>>20, m.Total
		}
	}
	l.addProps(h, &g)
	if !l.hasMIG {
		return g
	}
	var cur, pending uint32
	switch r := l.getMigMode(h, &cur, &pending); r {
	case Success:
	case ErrNotSupported:
		return g
	default:
		g.Err = l.err("nvmlDeviceGetMigMode", r)
		return g
	}
	if cur != 1 {
		return g
	}
	g.MIGEnabled = true
	var maxMIG uint32
	if r := l.getMaxMigDeviceCount(h, &maxMIG); r != Success {
		g.Err = l.err("nvmlDeviceGetMaxMigDeviceCount", r)
		return g
	}
	maxMIG = min(maxMIG, MaxMIGDevices)
	profiles := l.giProfiles(h)
	for j := uint32(0); j < maxMIG; j++ {
		var mh uintptr
		switch r := l.getMigDeviceHandleByIdx(h, j, &mh); r {
		case Success:
		case ErrNotFound:
			continue
		default:
			g.Err = l.err("nvmlDeviceGetMigDeviceHandleByIndex", r)
			return g
		}
		m, err := l.mig(h, mh, g.MemoryMiB, profiles)
		if err != nil {
			g.Err = err
			return g
		}
		m.Index = len(g.MIG)
		g.MIG = append(g.MIG, m)
	}
	return g
}

// mig queries MIG device h of GPU parent, whose GPU instance profiles
// are profiles.
func (l *dl) mig(parent, h uintptr, parentMiB uint64, profiles []giProfile) (MIG, error) {
	var m MIG
	var err error
	if m.UUID, err = l.uuid(h); err != nil {
		return m, err
	}
	var gi, ci uint32
	if r := l.getGpuInstanceID(h, &gi); r != Success {
		return m, l.err("nvmlDeviceGetGpuInstanceId", r)
	}
	if r := l.getComputeInstanceID(h, &ci); r != Success {
		return m, l.err("nvmlDeviceGetComputeInstanceId", r)
	}
	var a attributes
	if r := l.getAttributes(h, &a); r != Success {
		return m, l.err("nvmlDeviceGetAttributes_v2", r)
	}
	m.GI, m.CI = int(gi), int(ci)
	m.GISlices, m.CISlices = int(a.GPUInstanceSliceCount), int(a.ComputeInstanceSliceCount)
	m.MemoryMiB = a.MemorySizeMB
	m.Profile = ProfileName(m.GISlices, m.CISlices, m.MemoryMiB, parentMiB)
	m.Engines = enginesOf(a)
	l.addPlacement(parent, parentMiB, profiles, a, &m)
	return m, nil
}

// Close implements Lib. NVML frees an event set's memory at nvmlShutdown,
// and a wait on a set is a call that lasts up to its timeout (a second for
// the health goroutine's): Close first waits for each set's wait in
// progress to return and frees the set (a later Wait on it fails), then
// shuts NVML down. The library stays mapped: unloading code that other
// threads may still be returning through is never worth the bytes.
func (l *dl) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	for _, e := range l.sets {
		_ = e.free()
	}
	l.sets = nil
	if r := l.shutdown(); r != Success {
		return l.err("nvmlShutdown", r)
	}
	return nil
}

// events is Events over an nvmlEventSet_t.
type events struct {
	l     *dl
	set   uintptr
	uuids map[uintptr]string
	// mu is held for the whole of a wait, so that freeing the set (Close,
	// or the library's) waits for the wait to return.
	mu    sync.Mutex
	freed atomic.Bool
}

// Events implements Lib: it registers every GPU for critical XID events.
// GPUs that do not support them are left out; none supporting them is an
// error.
func (l *dl) Events() (Events, error) {
	if l.eventSetCreate == nil || l.registerEvents == nil || l.eventSetWait == nil || l.eventSetFree == nil {
		return nil, fmt.Errorf("nvml: the library has no event functions")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	l.sets = slices.DeleteFunc(l.sets, func(e *events) bool { return e.freed.Load() })
	var n uint32
	if r := l.getCount(&n); r != Success {
		return nil, l.err("nvmlDeviceGetCount_v2", r)
	}
	var set uintptr
	if r := l.eventSetCreate(&set); r != Success {
		return nil, l.err("nvmlEventSetCreate", r)
	}
	e := &events{l: l, set: set, uuids: map[uintptr]string{}}
	var firstErr error
	for i := uint32(0); i < min(n, MaxGPUs); i++ {
		var h uintptr
		if r := l.getHandleByIndex(i, &h); r != Success {
			continue
		}
		uuid, err := l.uuid(h)
		if err != nil {
			continue
		}
		if l.hasSupportedEventTypes {
			var types uint64
			if r := l.getSupportedEventTypes(h, &types); r == Success && types&EventTypeXidCriticalError == 0 {
				continue
			}
		}
		if r := l.registerEvents(h, EventTypeXidCriticalError, set); r != Success {
			if firstErr == nil {
				firstErr = l.err("nvmlDeviceRegisterEvents", r)
			}
			continue
		}
		e.uuids[h] = uuid
	}
	if len(e.uuids) == 0 {
		l.eventSetFree(set)
		if firstErr == nil {
			firstErr = fmt.Errorf("nvml: no GPU supports XID events")
		}
		return nil, firstErr
	}
	l.sets = append(l.sets, e)
	return e, nil
}

// Wait implements Events.
func (e *events) Wait(timeout time.Duration) (Event, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.freed.Load() {
		return Event{}, false, fmt.Errorf("nvml: event set freed: %w", ErrClosed)
	}
	ms := uint32(min(max(timeout.Milliseconds(), 0), 1<<31))
	var d eventData
	switch r := e.l.eventSetWait(e.set, &d, ms); r {
	case Success:
	case ErrTimeout:
		return Event{}, false, nil
	default:
		return Event{}, false, e.l.err("nvmlEventSetWait_v2", r)
	}
	if d.EventType&EventTypeXidCriticalError == 0 {
		return Event{}, false, nil
	}
	return Event{UUID: e.uuids[d.Device], XID: d.EventData, GI: d.GPUInstanceID, CI: d.ComputeInstanceID}, true, nil
}

// Close implements Events.
func (e *events) Close() error { return e.free() }

// free frees the set once, after the wait in progress (if any) returned.
func (e *events) free() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.freed.Load() {
		return nil
	}
	e.freed.Store(true)
	if r := e.l.eventSetFree(e.set); r != Success {
		return e.l.err("nvmlEventSetFree", r)
	}
	return nil
}

// Struct sizes, checked by layout_test.go against nvml.h's.
var (
	sizePciInfo    = unsafe.Sizeof(pciInfo{})
	sizeAttributes = unsafe.Sizeof(attributes{})
	sizeMemory     = unsafe.Sizeof(memory{})
	sizeEventData  = unsafe.Sizeof(eventData{})

	sizeGIProfileInfo  = unsafe.Sizeof(gpuInstanceProfileInfo{})
	sizeGIInfo         = unsafe.Sizeof(gpuInstanceInfo{})
	sizeCIProfileInfo  = unsafe.Sizeof(computeInstanceProfileInfo{})
	sizeCIInfo         = unsafe.Sizeof(computeInstanceInfo{})
	sizePlacement      = unsafe.Sizeof(placement32{})
	sizeAddressingMode = unsafe.Sizeof(addressingMode{})
)

// Versioner is implemented by the Lib that Open returns: NVML's own
// version and the driver version it reports ("" where the library lacks
// the function or it fails).
type Versioner interface {
	Version() (nvmlVersion, driverVersion string)
}

// Version returns nvmlSystemGetNVMLVersion's and
// nvmlSystemGetDriverVersion's answers.
func (l *dl) Version() (nvmlVersion, driverVersion string) {
	get := func(f func(*byte, uint32) Return) string {
		if f == nil {
			return ""
		}
		var buf [96]byte
		if f(&buf[0], uint32(len(buf))) != Success {
			return ""
		}
		return cstring(buf[:])
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return "", ""
	}
	return get(l.getNVMLVersion), get(l.getDriverVersion)
}
