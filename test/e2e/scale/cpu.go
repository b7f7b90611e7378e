package scale

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// processCPU is the CPU time process pid has had (the sum of its
// threads' /proc schedstat run times, in ns), 0 when unknown. Set side
// by side, two processes' CPU per pod is steadier than their wall-clock
// rate on a machine other work loads.
func processCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "schedstat"))
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err == nil {
			sum += time.Duration(ns)
		}
	}
	return sum
}

// cpuSample is the CPU time of the control plane's processes at one
// moment.
type cpuSample struct{ scheduler, apiserver, etcd time.Duration }

func (c *Cluster) cpu() cpuSample {
	return cpuSample{processCPU(c.PID("kube-scheduler")), processCPU(c.PID("kube-apiserver")), processCPU(c.PID("etcd"))}
}
