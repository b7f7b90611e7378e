package pipeline

import (
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// mpsMountOptions are the options of an MPS client's pipe directory and
// /dev/shm: read-write (a client writes its pipes and segments there),
// nothing to run or open as a device.
var mpsMountOptions = []string{"nosuid", "nodev", "noexec", "rbind", "rprivate"}

// mpsClient adds to adj (nil: an answer of its own) what makes the
// container a client of its GPU's MPS control daemon (sh, from shares;
// nil leaves adj as it is): the daemon's pipe directory from the host
// directory nri-gpu mps owns, at MPS's default /tmp/nvidia-mps (so that a
// process that drops the variable still finds the daemon) with
// CUDA_MPS_PIPE_DIRECTORY naming it; the daemons' /dev/shm; and the
// client limits of one replica, the daemon's own defaults:
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and, where the plan has the GPU's
// memory, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT. Every other CUDA_MPS_* that
// the pod spec or the image sets is set empty, and the node-wide pipe
// directory of the driver files (Source.Edits) is not mounted: the share
// is nri-gpu's, not the pod's. (The daemon holds each client process to
// its defaults whatever the environment says: the environment only keeps
// a client from asking for less.)
func (p *Path) mpsClient(c *call, adj *api.ContainerAdjustment, sh *sharing.Share) *api.ContainerAdjustment {
	if sh == nil {
		return adj
	}
	if adj == nil {
		adj = &api.ContainerAdjustment{}
	}
	nodeWide := inventory.DefaultMPSPipeDir
	env := make([]*api.KeyValue, 0, len(adj.Env)+3)
	for _, kv := range adj.Env {
		if kv.Key == inventory.EnvMPSPipeDir {
			nodeWide = kv.Value // the driver files' pipe directory, where the host has it
		}
		if !strings.HasPrefix(kv.Key, inventory.EnvMPSPrefix) {
			env = append(env, kv)
		}
	}
	// A new slice, not adj.Mounts filtered in place: the driver files'
	// mounts may be shared by every answer of the same capabilities.
	mounts := make([]*api.Mount, 0, len(adj.Mounts)+2)
	for _, m := range adj.Mounts {
		if m.Destination != nodeWide && m.Destination != inventory.DefaultMPSPipeDir && m.Destination != inventory.DevShm {
			mounts = append(mounts, m)
		}
	}
	d := sh.MPS
	mounts = append(mounts,
		&api.Mount{Source: d.PipeDir, Destination: inventory.DefaultMPSPipeDir, Type: "bind", Options: mpsMountOptions},
		&api.Mount{Source: d.ShmDir, Destination: inventory.DevShm, Type: "bind", Options: mpsMountOptions})
	adj.Mounts, adj.Env = mounts, env
	threads, memory := d.Limits()
	set := map[string]string{inventory.EnvMPSPipeDir: inventory.DefaultMPSPipeDir, inventory.EnvMPSActiveThreadPercentage: threads}
	if memory != "" {
		set[inventory.EnvMPSPinnedDeviceMemLimit] = "0=" + memory
	}
	for _, k := range []string{inventory.EnvMPSPipeDir, inventory.EnvMPSActiveThreadPercentage, inventory.EnvMPSPinnedDeviceMemLimit} {
		if v, ok := set[k]; ok {
			adj.AddEnv(k, v)
		}
	}
	for _, e := range c.ctr.GetEnv() {
		// The pod's or the image's: not a share nri-gpu gave. Set empty,
		// as unset to MPS: NRI (v0.12) does not pass a plugin's removal of
		// a variable of the container's own spec on to the runtime.
		k, v, _ := strings.Cut(e, "=")
		if _, ours := set[k]; strings.HasPrefix(k, inventory.EnvMPSPrefix) && !ours && v != "" {
			set[k] = ""
			adj.AddEnv(k, "")
		}
	}
	return adj
}
