package doctor

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// ParamsFile is the kernel module's parameter report, read under hostRoot:
// one "Name: value" line per parameter.
const ParamsFile = "/proc/driver/nvidia/params"

// checkDeviceFiles reports the kernel module's ModifyDeviceFiles setting
// (docs/security.md): with 1, the driver's default, the driver's
// user-space libraries (nvidia-smi run as root) create and fix up
// /dev/nvidia* nodes, also inside a container and also for GPUs the
// container was not given. nri-gpu cannot stop that inside a container
// (it would take a hook); the cgroup's device rules still deny opening
// such a node, so this is reported, not failed.
func checkDeviceFiles(o *Options, snap *inventory.Snapshot, out *[]Result) {
	const name = "device files"
	if snap == nil || snap.DriverVersion == "" {
		add(out, Kernel, name, Skip, "no kernel driver", "fix the driver first")
		return
	}
	data, err := os.ReadFile(o.host(ParamsFile))
	if err != nil {
		add(out, Kernel, name, Warn, fmt.Sprintf("cannot read %s: %v", ParamsFile, err), "check hostRoot in the configuration")
		return
	}
	v, ok := moduleParam(data, "ModifyDeviceFiles")
	switch {
	case !ok:
		add(out, Kernel, name, Warn, ParamsFile+" has no ModifyDeviceFiles line", "check that hostRoot shows the host's /proc")
	case v == "0":
		add(out, Kernel, name, Pass, "ModifyDeviceFiles: 0: the driver creates no device nodes; containers get only the nodes injected", "")
	default:
		add(out, Kernel, name, Pass, fmt.Sprintf("ModifyDeviceFiles: %s (the driver's default): nvidia-smi run as root in a container may create device nodes for GPUs it was not given; the cgroup's device rules still deny opening them (docs/security.md)", v), "")
	}
}

// moduleParam returns the value of the named parameter in a
// /proc/driver/nvidia/params report.
func moduleParam(data []byte, name string) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}
