package inventory

import (
	"strings"
)

// Capability is one of the NVIDIA driver capabilities of
// NVIDIA_DRIVER_CAPABILITIES: it selects which driver files a container gets.
type Capability uint8

// The driver capabilities, as the NVIDIA container toolkit names them.
const (
	Compute Capability = 1 << iota
	Compat32
	Graphics
	Utility
	Video
	Display
	NGX
)

// Capabilities is a set of driver capabilities.
type Capabilities uint8

// AllCapabilities is the set that "all" stands for.
const AllCapabilities = Capabilities(Compute | Compat32 | Graphics | Utility | Video | Display | NGX)

// DefaultCapabilities is what a container gets when it names none:
// "utility,compute", as with the NVIDIA toolkit.
const DefaultCapabilities = Capabilities(Utility | Compute)

// capabilityNames lists every capability with its name, in the order used
// when printing a set.
var capabilityNames = []struct {
	cap  Capability
	name string
}{
	{Compute, "compute"},
	{Compat32, "compat32"},
	{Graphics, "graphics"},
	{Utility, "utility"},
	{Video, "video"},
	{Display, "display"},
	{NGX, "ngx"},
}

// CapabilityByName returns the capability with the given lower-case name.
func CapabilityByName(name string) (Capability, bool) {
	for _, c := range capabilityNames {
		if c.name == name {
			return c.cap, true
		}
	}
	return 0, false
}

// CapabilityNames returns the valid capability names, for error messages.
func CapabilityNames() []string {
	names := make([]string, 0, len(capabilityNames))
	for _, c := range capabilityNames {
		names = append(names, c.name)
	}
	return names
}

// String returns the capability's name.
func (c Capability) String() string {
	for _, n := range capabilityNames {
		if n.cap == c {
			return n.name
		}
	}
	return "unknown"
}

// Has reports whether the set holds c.
func (s Capabilities) Has(c Capability) bool { return s&Capabilities(c) != 0 }

// With returns the set with c added.
func (s Capabilities) With(c Capability) Capabilities { return s | Capabilities(c) }

// List returns the capabilities of the set in a stable order.
func (s Capabilities) List() []Capability {
	var out []Capability
	for _, c := range capabilityNames {
		if s.Has(c.cap) {
			out = append(out, c.cap)
		}
	}
	return out
}

// String returns the set as a comma-separated list of names.
func (s Capabilities) String() string {
	var b strings.Builder
	for _, c := range capabilityNames {
		if s.Has(c.cap) {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(c.name)
		}
	}
	return b.String()
}
