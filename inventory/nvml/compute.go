package nvml

import (
	"fmt"
	"strings"
)

// ComputeMode is an nvmlComputeMode_t: which processes may use a GPU.
type ComputeMode uint32

// Compute modes (nvml.h).
const (
	// ComputeModeDefault lets any number of processes use the GPU.
	ComputeModeDefault ComputeMode = 0
	// ComputeModeProhibited lets no process use the GPU.
	ComputeModeProhibited ComputeMode = 2
	// ComputeModeExclusiveProcess lets one process use the GPU: under
	// MPS that process is the MPS server, through which every client
	// runs.
	ComputeModeExclusiveProcess ComputeMode = 3
)

// String names the mode as nvidia-smi does.
func (m ComputeMode) String() string {
	switch m {
	case ComputeModeDefault:
		return "Default"
	case 1:
		return "Exclusive_Thread"
	case ComputeModeProhibited:
		return "Prohibited"
	case ComputeModeExclusiveProcess:
		return "Exclusive_Process"
	}
	return fmt.Sprintf("ComputeMode(%d)", uint32(m))
}

// ErrNoPermission is NVML_ERROR_NO_PERMISSION: setting a compute mode
// needs root (and, in a container, the GPU's device nodes and
// CAP_SYS_ADMIN).
const ErrNoPermission Return = 4

// ComputeModes is implemented by the Lib that Open returns: a GPU's
// compute mode, by UUID. MPS needs its GPUs in ComputeModeExclusiveProcess.
type ComputeModes interface {
	ComputeMode(uuid string) (ComputeMode, error)
	SetComputeMode(uuid string, m ComputeMode) error
}

// computeFuncs are NVML's compute-mode functions, bound on first use.
type computeFuncs struct {
	bound  bool
	err    error
	byUUID func(*byte, *uintptr) Return
	get    func(uintptr, *uint32) Return
	set    func(uintptr, uint32) Return
}

// handleByUUID binds the compute-mode functions if needed and returns the
// device uuid names. The caller holds l.mu.
func (l *dl) handleByUUID(uuid string) (uintptr, error) {
	if l.closed {
		return 0, fmt.Errorf("nvml: closed")
	}
	c := &l.compute
	if !c.bound {
		c.bound = true
		for _, f := range []struct {
			ptr  any
			name string
		}{{&c.byUUID, "nvmlDeviceGetHandleByUUID"}, {&c.get, "nvmlDeviceGetComputeMode"}, {&c.set, "nvmlDeviceSetComputeMode"}} {
			if err := l.sym(f.ptr, f.name, true); err != nil {
				c.err = fmt.Errorf("nvml: %w", err)
				break
			}
		}
	}
	if c.err != nil {
		return 0, c.err
	}
	if uuid == "" || len(uuid) >= uuidBufferSize || strings.ContainsRune(uuid, 0) {
		return 0, fmt.Errorf("nvml: bad GPU UUID %q", uuid)
	}
	name := append([]byte(uuid), 0)
	var h uintptr
	if r := c.byUUID(&name[0], &h); r != Success {
		return 0, l.err("nvmlDeviceGetHandleByUUID", r)
	}
	return h, nil
}

// ComputeMode implements ComputeModes.
func (l *dl) ComputeMode(uuid string) (ComputeMode, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, err := l.handleByUUID(uuid)
	if err != nil {
		return 0, err
	}
	var m uint32
	if r := l.compute.get(h, &m); r != Success {
		return 0, l.err("nvmlDeviceGetComputeMode", r)
	}
	return ComputeMode(m), nil
}

// SetComputeMode implements ComputeModes.
func (l *dl) SetComputeMode(uuid string, m ComputeMode) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, err := l.handleByUUID(uuid)
	if err != nil {
		return err
	}
	if r := l.compute.set(h, uint32(m)); r != Success {
		return l.err("nvmlDeviceSetComputeMode", r)
	}
	return nil
}
