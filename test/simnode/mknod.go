package simnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// NoMknodEnv names an environment variable that, when not empty, makes
// CanMknod report that device nodes cannot be made even where they can: a
// root user sees the tests as a user without root sees them
// (NRI_GPU_SIMNODE_NO_MKNOD=1 go test ./...).
const NoMknodEnv = "NRI_GPU_SIMNODE_NO_MKNOD"

var (
	mknodOnce sync.Once
	mknodErr  error
)

// CanMknod reports whether this process can create the character device
// nodes that Options.DeviceNodes and GenerateVendor lay out: nil when it
// can, otherwise why not (not root, root without CAP_MKNOD as in a user
// namespace, or NoMknodEnv set). It tries once, in a temporary directory.
// Tests that check device nodes skip with it; tests that do not check
// them build the node without (Options.DeviceNodes false).
func CanMknod() error {
	mknodOnce.Do(func() {
		if v := os.Getenv(NoMknodEnv); v != "" {
			mknodErr = fmt.Errorf("%s=%s is set", NoMknodEnv, v)
			return
		}
		dir, err := os.MkdirTemp("", "simnode-mknod-")
		if err != nil {
			mknodErr = err
			return
		}
		defer os.RemoveAll(dir)
		err = syscall.Mknod(filepath.Join(dir, "nvidiactl"), syscall.S_IFCHR|0o666, int(Makedev(nvidiaMajor, nvidiaCtlMinor)))
		switch {
		case err == nil:
		case errors.Is(err, syscall.EPERM) && os.Geteuid() != 0:
			mknodErr = fmt.Errorf("mknod of a character device is refused to uid %d (it needs root)", os.Geteuid())
		case errors.Is(err, syscall.EPERM):
			mknodErr = fmt.Errorf("mknod of a character device is refused to root here (no CAP_MKNOD, as in a user namespace)")
		default:
			mknodErr = fmt.Errorf("mknod of a character device: %w", err)
		}
	})
	return mknodErr
}
