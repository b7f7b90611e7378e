// Package policy says which pods may ask for GPUs through which request
// source. It is the injector's privilege boundary made explicit: a pod that
// can name a GPU gets a device node of the host. Everything here is pure.
package policy

import (
	"fmt"
	"slices"
	"strings"
)

// Source is a kind of GPU request, as far as the policy is concerned.
type Source uint8

// Request sources.
const (
	// Annotation is nri-gpu's own pod annotation (gpus.nri-gpu.dev/...).
	Annotation Source = iota + 1
	// CDI is the NVIDIA toolkit's CDI annotation (nvidia.cdi.k8s.io/...)
	// naming nvidia.com/gpu devices.
	CDI
	// Management is a CDI annotation naming management.nvidia.com/gpu=all.
	Management
	// DeviceList is the device plugin's list of /dev/null mounts under
	// /var/run/nvidia-container-devices. A pod that may mount hostPath
	// volumes can forge it, so outside DeviceListNamespaces it names GPUs
	// only together with their device nodes (see TrustsDeviceList).
	DeviceList
	// Env is the NVIDIA_VISIBLE_DEVICES environment variable, which any
	// image can set.
	Env
	// IMEX is a request for IMEX channels (multi-node NVLink memory
	// sharing), whatever carries it: the annotation's imex-channels
	// field, the device plugin's imex/ mounts, NVIDIA_IMEX_CHANNELS. A
	// channel gives access to the memory that other nodes of the NVLink
	// domain export on it, so it is a source of its own.
	IMEX
)

func (s Source) String() string {
	switch s {
	case Annotation:
		return "annotation"
	case CDI:
		return "CDI annotation"
	case Management:
		return "management CDI annotation"
	case DeviceList:
		return "device-list mounts"
	case Env:
		return "env NVIDIA_VISIBLE_DEVICES"
	case IMEX:
		return "IMEX channel request"
	}
	return "unknown source"
}

// VisibleDevicesMode is the value of policy.visibleDevices: how
// NVIDIA_VISIBLE_DEVICES requests are handled.
type VisibleDevicesMode string

// VisibleDevices modes.
const (
	// VisibleDevicesAllow honours the variable in every namespace, as the
	// NVIDIA toolkit does.
	VisibleDevicesAllow VisibleDevicesMode = "allow"
	// VisibleDevicesDeny ignores it everywhere.
	VisibleDevicesDeny VisibleDevicesMode = "deny"
	// VisibleDevicesNamespaces honours it only in EnvNamespaces.
	VisibleDevicesNamespaces VisibleDevicesMode = "namespaces"
)

// DefaultMode is the value of policy.default: what a namespace list that
// is empty means.
type DefaultMode string

// Default modes.
const (
	// DefaultAllow: an empty list means every namespace, and
	// visibleDevices defaults to allow (the NVIDIA toolkit's behaviour).
	DefaultAllow DefaultMode = "allow"
	// DefaultDeny: an empty list means no namespace, and visibleDevices
	// defaults to deny (for a cluster whose pod authors are not the
	// node's operator).
	DefaultDeny DefaultMode = "deny"
)

// Policy is the "policy" block of the configuration file. The zero value
// allows every source in every namespace, which is the NVIDIA toolkit's
// behaviour.
type Policy struct {
	// Default says what an empty namespace list below means: allow (the
	// default) every namespace, or deny every namespace.
	Default DefaultMode `json:"default,omitempty"`
	// AnnotationNamespaces may use gpus.nri-gpu.dev annotations; empty
	// means what Default says.
	AnnotationNamespaces []string `json:"annotationNamespaces,omitempty"`
	// CDINamespaces may use nvidia.cdi.k8s.io annotations naming
	// nvidia.com/gpu devices; empty means what Default says.
	CDINamespaces []string `json:"cdiNamespaces,omitempty"`
	// ManagementNamespaces may ask for management.nvidia.com/gpu=all;
	// empty means what Default says.
	ManagementNamespaces []string `json:"managementNamespaces,omitempty"`
	// DeviceListNamespaces may name GPUs by the device plugin's mount
	// list alone; empty means what Default says. Elsewhere the list is
	// honoured only in a container that the runtime gave the GPUs'
	// device nodes (the device plugin's PASS_DEVICE_SPECS=true), and
	// those nodes decide its GPUs.
	DeviceListNamespaces []string `json:"deviceListNamespaces,omitempty"`
	// VisibleDevices is allow, deny or namespaces; it defaults to
	// Default's mode.
	VisibleDevices VisibleDevicesMode `json:"visibleDevices,omitempty"`
	// EnvNamespaces may use NVIDIA_VISIBLE_DEVICES when VisibleDevices is
	// namespaces.
	EnvNamespaces []string `json:"envNamespaces,omitempty"`
	// IMEXNamespaces may ask for IMEX channels, by any carrier; empty
	// means what Default says.
	IMEXNamespaces []string `json:"imexNamespaces,omitempty"`
}

// SetDefaults fills in the default modes.
func (p *Policy) SetDefaults() {
	if p.Default == "" {
		p.Default = DefaultAllow
	}
	if p.VisibleDevices == "" {
		p.VisibleDevices = VisibleDevicesAllow
		if p.Default == DefaultDeny {
			p.VisibleDevices = VisibleDevicesDeny
		}
	}
}

// Validate checks the modes and the namespace names; errors name the key
// (policy.<key>) and the bad value.
func (p Policy) Validate() error {
	switch p.Default {
	case "", DefaultAllow, DefaultDeny:
	default:
		return fmt.Errorf("key policy.default: %q is not a valid mode (valid: allow, deny)", p.Default)
	}
	switch p.VisibleDevices {
	case VisibleDevicesAllow, VisibleDevicesDeny:
		if len(p.EnvNamespaces) > 0 {
			return fmt.Errorf("key policy.envNamespaces: only used with policy.visibleDevices: namespaces (it is %q)", p.VisibleDevices)
		}
	case VisibleDevicesNamespaces:
		if len(p.EnvNamespaces) == 0 {
			return fmt.Errorf("key policy.envNamespaces: must list at least one namespace with policy.visibleDevices: namespaces")
		}
	default:
		return fmt.Errorf("key policy.visibleDevices: %q is not a valid mode (valid: allow, deny, namespaces)", p.VisibleDevices)
	}
	for _, l := range []struct {
		key string
		ns  []string
	}{
		{"annotationNamespaces", p.AnnotationNamespaces},
		{"cdiNamespaces", p.CDINamespaces},
		{"managementNamespaces", p.ManagementNamespaces},
		{"deviceListNamespaces", p.DeviceListNamespaces},
		{"envNamespaces", p.EnvNamespaces},
		{"imexNamespaces", p.IMEXNamespaces},
	} {
		for _, n := range l.ns {
			if !validNamespace(n) {
				return fmt.Errorf("key policy.%s: %q is not a Kubernetes namespace name (lower-case letters, digits and '-', at most 63)", l.key, n)
			}
		}
	}
	return nil
}

// validNamespace reports whether n is an RFC 1123 label, as Kubernetes
// namespace names are.
func validNamespace(n string) bool {
	if n == "" || len(n) > 63 || n[0] == '-' || n[len(n)-1] == '-' {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if valid := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-'; !valid {
			return false
		}
	}
	return true
}

// Allows reports whether a pod in namespace may use source s. The device
// list is allowed everywhere, as a request: whether it may name GPUs on its
// own, without their device nodes, is TrustsDeviceList.
func (p Policy) Allows(s Source, namespace string) bool {
	switch s {
	case Annotation:
		return p.listed(p.AnnotationNamespaces, namespace)
	case CDI:
		return p.listed(p.CDINamespaces, namespace)
	case Management:
		return p.listed(p.ManagementNamespaces, namespace)
	case DeviceList:
		return true
	case IMEX:
		return p.listed(p.IMEXNamespaces, namespace)
	case Env:
		switch p.VisibleDevices {
		case VisibleDevicesDeny:
			return false
		case VisibleDevicesNamespaces:
			return slices.Contains(p.EnvNamespaces, namespace)
		}
		return true
	}
	return false
}

// TrustsDeviceList reports whether the device plugin's mount list alone
// may name the GPUs of a pod in namespace. Where it may not, only a
// container that the runtime gave GPU device nodes is served, and with
// those GPUs: a mount list forged through a hostPath volume gets nothing.
func (p Policy) TrustsDeviceList(namespace string) bool {
	return p.listed(p.DeviceListNamespaces, namespace)
}

// Setting returns the configuration key that decides about s, for
// messages.
func (p Policy) Setting(s Source) string {
	switch s {
	case Annotation:
		return "policy.annotationNamespaces: " + p.list(p.AnnotationNamespaces)
	case CDI:
		return "policy.cdiNamespaces: " + p.list(p.CDINamespaces)
	case Management:
		return "policy.managementNamespaces: " + p.list(p.ManagementNamespaces)
	case DeviceList:
		return "policy.deviceListNamespaces: " + p.list(p.DeviceListNamespaces)
	case IMEX:
		return "policy.imexNamespaces: " + p.list(p.IMEXNamespaces)
	case Env:
		if p.VisibleDevices == VisibleDevicesNamespaces {
			return "policy.visibleDevices: namespaces, policy.envNamespaces: " + p.list(p.EnvNamespaces)
		}
		return "policy.visibleDevices: " + string(p.VisibleDevices)
	}
	return ""
}

// listed reports whether namespace is in ns; an empty ns means every
// namespace unless Default is deny.
func (p Policy) listed(ns []string, namespace string) bool {
	if len(ns) == 0 {
		return p.Default != DefaultDeny
	}
	return slices.Contains(ns, namespace)
}

func (p Policy) list(ns []string) string {
	if len(ns) == 0 {
		if p.Default == DefaultDeny {
			return "[] (none: policy.default is deny)"
		}
		return "[] (any)"
	}
	return "[" + strings.Join(ns, ", ") + "]"
}
