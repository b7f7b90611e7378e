package doctor

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Whom the doctor believes. Anyone on the node can start a process named
// nri-gpu, or serve HTTP on a unix socket, and have it say "ready"; only
// nri-gpu itself, running as root (or as the user running the doctor, on
// a test machine), is asked. A status socket must be owned by such a user
// and served by a process of such a user (its peer credentials,
// SO_PEERCRED, which the kernel records at connect and the peer cannot
// forge); a process found by name must run as such a user.

// trustedUID reports whether uid is root or this process's effective uid.
func trustedUID(uid uint32) bool {
	return uid == 0 || uid == uint32(os.Geteuid())
}

// trustedUsers names the users trusted, for verdicts.
func trustedUsers() string {
	if os.Geteuid() == 0 {
		return "root"
	}
	return fmt.Sprintf("root or this user (uid %d)", os.Geteuid())
}

// socketOwner returns why the socket at p is not trusted: "" when its
// owner is trusted (or it cannot be stat'ed: the connection then fails).
func socketOwner(p string) string {
	fi, err := os.Stat(p)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "of an unknown owner"
	}
	if !trustedUID(st.Uid) {
		return fmt.Sprintf("owned by uid %d, not %s", st.Uid, trustedUsers())
	}
	return ""
}

// untrustedPeer is the error of a connection to a socket served by a
// process of an untrusted user.
type untrustedPeer struct{ pid, uid int32 }

func (e *untrustedPeer) Error() string {
	return fmt.Sprintf("served by pid %d of uid %d, not %s", e.pid, e.uid, trustedUsers())
}

// dialTrusted connects to the unix socket p and checks the credentials
// of the process that serves it (SO_PEERCRED).
func dialTrusted(ctx context.Context, p string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", p)
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("%s: not a unix connection", p)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		credErr = err
	}
	if credErr != nil {
		c.Close()
		return nil, fmt.Errorf("%s: reading the peer's credentials: %w", p, credErr)
	}
	if !trustedUID(cred.Uid) {
		c.Close()
		return nil, &untrustedPeer{pid: cred.Pid, uid: int32(cred.Uid)}
	}
	return c, nil
}

// processUIDs reads the uids (real, effective, saved, file system) of the
// process whose /proc/<pid>/status is at statusPath.
func processUIDs(statusPath string) ([]uint32, error) {
	data, err := os.ReadFile(statusPath)
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		v, ok := strings.CutPrefix(line, "Uid:")
		if !ok {
			continue
		}
		var uids []uint32
		for _, f := range strings.Fields(v) {
			u, err := strconv.ParseUint(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%s: Uid: %q", statusPath, v)
			}
			uids = append(uids, uint32(u))
		}
		if len(uids) == 0 {
			break
		}
		return uids, nil
	}
	return nil, fmt.Errorf("%s: no Uid line", statusPath)
}
