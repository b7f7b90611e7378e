package cdisource

import (
	"fmt"
	"os"
	"syscall"
)

// Trusted returns why nri-gpu does not trust the CDI spec file or
// directory at p, "" when it does: it (what a symbolic link points to)
// must be owned by root and writable by no one else (no group or other
// write bit). A spec says which host paths a container gets and which
// hooks run as root, so whoever can write it, or add a spec to its
// directory, can give any container anything on the host.
//
// The process's own user is trusted like root: nri-gpu runs as root on a
// node, where the two are one; where it does not (a test run as an
// ordinary user), a user that can write its own files gains nothing by
// writing a spec. A path that does not exist is not refused: it has no
// spec (the CDI library skips a missing directory).
func Trusted(p string) string {
	fi, err := os.Stat(p)
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		return err.Error()
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "its owner is unknown"
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Sprintf("owned by uid %d, not root", st.Uid)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Sprintf("mode %#o: writable by its group or others, not only root", perm)
	}
	return ""
}

// readOnly reports whether a mount with these options is read-only: "ro"
// (or "rro", recursively) given, and not undone by a later "rw".
func readOnly(options []string) bool {
	ro := false
	for _, o := range options {
		switch o {
		case "ro", "rro":
			ro = true
		case "rw":
			ro = false
		}
	}
	return ro
}
