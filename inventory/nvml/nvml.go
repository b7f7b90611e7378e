// Package nvml is nri-gpu's binding of NVIDIA's management library
// (libnvidia-ml.so.1), loaded at run time with dlopen and called without
// cgo (github.com/ebitengine/purego). The library is the driver's own,
// found by discovery under the driver root; a request never names it.
//
// The rest of nri-gpu sees the small Lib interface: the GPUs NVML
// enumerates with their MIG devices, and the XID events of a set of
// devices. Everything it returns is a plain value; handles never leave
// this package. docs/design.md says why purego and not cgo.
package nvml

import (
	"errors"
	"fmt"
	"time"
)

// Lib is what nri-gpu uses of NVML. Implementations are safe for use by
// one goroutine for Devices and another for Wait.
type Lib interface {
	// Devices enumerates the GPUs in NVML index order with their MIG
	// devices.
	Devices() ([]GPU, error)
	// Events starts listening for critical XID events of every GPU.
	Events() (Events, error)
	// Close shuts NVML down.
	Close() error
}

// Events is a set of NVML events being listened for.
type Events interface {
	// Wait waits up to timeout for the next event; ok is false on a
	// timeout.
	Wait(timeout time.Duration) (ev Event, ok bool, err error)
	// Close frees the event set.
	Close() error
}

// GPU is one GPU as NVML reports it.
type GPU struct {
	// Index is NVML's index (PCI order).
	Index int
	UUID  string
	// BusID is NVML's form, "00000000:1B:00.0".
	BusID string
	// Name is NVML's product name, "NVIDIA H100 80GB HBM3".
	Name string
	// MemoryMiB is the GPU's total memory; MemoryBytes the same in
	// bytes, as nvmlDeviceGetMemoryInfo reports it.
	MemoryMiB   uint64
	MemoryBytes uint64
	// Brand and Architecture are NVML's, named as NVIDIA's go-nvlib
	// names them ("Nvidia", "Hopper"); ComputeCapability is the CUDA
	// compute capability, "9.0"; AddressingMode is "HMM", "ATS" or
	// "None" on a platform with coherent memory. Empty when NVML does
	// not tell (an older library, a GPU that does not support it).
	Brand, Architecture, ComputeCapability, AddressingMode string
	// CUDADriverVersion is the CUDA version the driver supports,
	// major.minor ("13.0"), the same for every GPU; empty when NVML does
	// not tell.
	CUDADriverVersion string
	// MIGEnabled is the current MIG mode.
	MIGEnabled bool
	// MIG are the GPU's MIG devices, by MIG index; empty without MIG.
	MIG []MIG
	// Err is set when NVML reported the GPU but could not query it
	// (a lost GPU); the other fields may then be partial.
	Err error
}

// MIG is one MIG device (a compute instance of a GPU instance).
type MIG struct {
	// Index is the MIG device's index under its GPU, as
	// NVIDIA_VISIBLE_DEVICES=<gpu>:<mig> counts.
	Index int
	UUID  string
	GI    int
	CI    int
	// Profile is the MIG profile name, "1g.10gb" (with a "<n>c." prefix
	// when the compute instance uses part of its GPU instance:
	// "1c.2g.20gb").
	Profile string
	// MemoryMiB is the instance's memory: its GPU instance profile's
	// when NVML names the profile, its device attributes' otherwise.
	MemoryMiB uint64
	GISlices  int
	CISlices  int
	// Placement is the GPU instance's profile id and memory slices; nil
	// when NVML does not tell (an older library, a process NVML refuses
	// GPU instances to).
	Placement *Placement
	// Engines are the device's multiprocessors and engines: its GPU
	// instance profile's, as NVIDIA's DRA driver publishes them, or its
	// device attributes' without the profile.
	Engines Engines
}

// Placement is where a GPU instance lies on its GPU (nvmlGpuInstanceGetInfo):
// its GPU instance profile id (19 for an H100's 1g.10gb) and the memory
// slices it occupies, from Start for Size.
type Placement struct {
	ProfileID, Start, Size int
}

// Engines are a MIG device's multiprocessors and engines.
type Engines struct {
	Multiprocessors, CopyEngines, Decoders, Encoders, JPEGs, OFAs uint32
}

// Event is an XID event.
type Event struct {
	// UUID is the GPU the event came from.
	UUID string
	// XID is the error's XID number.
	XID uint64
	// GI and CI are the GPU and compute instance the event is
	// attributable to, or NoInstance.
	GI, CI uint32
}

// ErrClosed is the error of a Lib used after Close, and of an Events
// waited on after it (or its own Close).
var ErrClosed = errors.New("nvml: closed")

// NoInstance is Event.GI/CI where the event is not attributable to a MIG
// instance (NVML's 0xFFFFFFFF).
const NoInstance = 0xFFFFFFFF

// Return is an nvmlReturn_t.
type Return int32

// NVML return codes (nvml.h).
const (
	Success           Return = 0
	ErrUninitialized  Return = 1
	ErrInvalidArg     Return = 2
	ErrNotSupported   Return = 3
	ErrNotFound       Return = 6
	ErrInsufficient   Return = 7
	ErrTimeout        Return = 10
	ErrFunctionAbsent Return = 13
	ErrGPUIsLost      Return = 15
	ErrResetRequired  Return = 16 // 14 is NVML_ERROR_CORRUPTED_INFOROM
)

// Error is an NVML call that failed.
type Error struct {
	Func string
	Code Return
	Text string
}

func (e *Error) Error() string {
	if e.Text != "" {
		return fmt.Sprintf("%s: %s (%d)", e.Func, e.Text, e.Code)
	}
	return fmt.Sprintf("%s: NVML error %d", e.Func, e.Code)
}

// IsCode reports whether err is an NVML error with code c.
func IsCode(err error, c Return) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == c
}

// ProfileName returns the MIG profile name of a MIG device from its
// attributes and its parent's total memory, the way NVIDIA's device plugin
// names it: the GPU instance's slices, its memory as a fraction of the
// GPU's rounded up to eighths times the GPU's memory in GiB (rounded up),
// and a "<n>c." prefix when the compute instance has fewer slices than its
// GPU instance. An A100 40GB's 4864 MiB slice is "1g.5gb", an H100 80GB's
// 9984 MiB one "1g.10gb".
func ProfileName(giSlices, ciSlices int, memMiB, parentMiB uint64) string {
	gb := uint64(0)
	if parentMiB > 0 {
		eighths := (memMiB*8 + parentMiB - 1) / parentMiB // ceil(mem/parent*8)
		totalGB := (parentMiB + 1023) / 1024
		gb = (eighths*totalGB + 4) / 8 // round(eighths/8 * totalGB)
	}
	name := fmt.Sprintf("%dg.%dgb", giSlices, gb)
	if ciSlices > 0 && ciSlices < giSlices {
		name = fmt.Sprintf("%dc.%s", ciSlices, name)
	}
	return name
}
