package sharing

import "fmt"

// Mode says how a holder holds its GPUs: shared with other shared
// holders, or alone. The node's mode for requests that do not say
// exclusive= is the configuration's sharing key (ParseMode).
type Mode uint8

// Modes of holding.
const (
	// Shared holders may hold a GPU together with other shared holders.
	Shared Mode = iota
	// Exclusive holders hold a GPU alone.
	Exclusive
)

// String returns "shared" or "exclusive".
func (m Mode) String() string {
	if m == Exclusive {
		return "exclusive"
	}
	return "shared"
}

// ParseMode parses "shared" or "exclusive".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "shared":
		return Shared, nil
	case "exclusive":
		return Exclusive, nil
	}
	return 0, fmt.Errorf("unknown sharing mode %q (valid: shared, exclusive)", s)
}
