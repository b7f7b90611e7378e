package inventory

import (
	"fmt"
	"path"
	"strings"
)

// DriverProblem says what makes the snapshot's driver unfit to inject, or
// returns "" when nothing does. A driver is broken when the kernel module
// is loaded (a version is known) but no user-space library was found, or
// when a library does not carry the kernel module's version: user space
// and kernel disagree, as in the middle of an upgrade or after a partial
// one. A node without a driver at all is not broken; it offers no GPU.
func (s *Snapshot) DriverProblem() string {
	if s.DriverVersion == "" {
		return ""
	}
	var libs int
	var stale []string
	for _, f := range s.Files {
		if f.Kind != Library && f.Kind != Library32 {
			continue
		}
		libs++
		if !f.OwnVersion && !strings.HasSuffix(path.Base(f.HostPath), "."+s.DriverVersion) {
			stale = append(stale, f.HostPath)
		}
	}
	switch {
	case libs == 0:
		return fmt.Sprintf("kernel module %s is loaded but no driver library was found under driverRoot %s", s.DriverVersion, s.DriverRoot)
	case len(stale) == 1:
		return fmt.Sprintf("%s does not carry the kernel module's version %s", stale[0], s.DriverVersion)
	case len(stale) > 1:
		return fmt.Sprintf("%d of %d driver libraries (%s, ...) do not carry the kernel module's version %s", len(stale), libs, stale[0], s.DriverVersion)
	}
	return ""
}
