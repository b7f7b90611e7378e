package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Renice sets the nice value of every thread of process pid (0: this
// process). Linux keeps nice per thread, and threads and children inherit
// it, so a process reniced before it starts containers passes its priority
// on to shims, runc and hooks. The benchmark runs its whole stack at a
// higher priority than other work on the machine to cut the noise that
// work adds; every path gets the same priority.
func Renice(pid, nice int) error {
	if pid == 0 {
		pid = os.Getpid()
	}
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*"))
	if err != nil {
		return err
	}
	var first error
	for _, t := range tasks {
		tid, err := strconv.Atoi(filepath.Base(t))
		if err != nil {
			continue
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil && first == nil {
			first = err
		}
	}
	return first
}
