package suite

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/bench"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// nvidiaDRA is NVIDIA's own DRA driver for GPUs (gpu-kubelet-plugin,
// harness.InstallNVIDIADRA) running as a node's kubelet plugin of
// gpu.nvidia.com, as its DaemonSet would, but as a process in the node's
// namespaces: the node's kubelet plugin directories and CDI directory,
// the simulated driver at harness.NodeDriverRoot, the cluster's API
// server.
type nvidiaDRA struct {
	node *harness.Node
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// nvidiaDRAOptions are what a test changes of NVIDIA's driver: its feature
// gates ("MPSSupport=true,..."), the CPU cgroup whose weight it gets (that
// of nri-gpu's container, driverCgroup), where its Prometheus metrics
// listen (":8080"; none when empty).
type nvidiaDRAOptions struct {
	featureGates string
	cgroup       string
	http         string
}

// nvidiaDRAHook installs the NVIDIA Container Toolkit's nvidia-cdi-hook
// (the version the bench measures), which NVIDIA's driver names in the
// hooks of its CDI specs, and returns its path.
func nvidiaDRAHook(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(harness.DefaultCacheDir(), "nvidia-container-toolkit-"+bench.ToolkitVersion)
	hook, err := harness.GoInstall(context.Background(), dir, "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook@"+bench.ToolkitVersion, "nvidia-cdi-hook", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return hook
}

// nvidiaDRAScript runs NVIDIA's driver ("$@") in a mount namespace of its
// own within the node's, where the simulated node's /proc/driver and
// /proc/devices lie over the host's: the driver reads them at those
// absolute paths (the MIG capability files and the nvidia-caps major
// when it prepares a MIG device), as a real node's kernel module provides
// them.
const nvidiaDRAScript = `root=$1; shift
mount --bind "$root/proc/driver" /proc/driver
mount --bind "$root/proc/devices" /proc/devices
exec "$@"`

// startNVIDIADRA starts NVIDIA's driver on node n of cluster c and stops
// it when the test ends (printing its log's tail if the test failed).
func startNVIDIADRA(t *testing.T, c *harness.Cluster, n *harness.Node, o nvidiaDRAOptions) *nvidiaDRA {
	t.Helper()
	bin, err := harness.InstallNVIDIADRA(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{
		"--node-name", n.Name,
		"--namespace", "nvidia-dra-driver-gpu",
		// Any name: it is used only in the MPS control daemon's pod template.
		"--image-name", "nvcr.io/nvidia/k8s-dra-driver-gpu:" + harness.NVIDIADRAVersion,
		"--kubeconfig", c.Kubeconfig,
		"--nvidia-driver-root", harness.NodeDriverRoot,
		"--container-driver-root", harness.NodeDriverRoot,
		"--cdi-root", harness.NodeCDIDir,
		"--nvidia-cdi-hook-path", nvidiaDRAHook(t),
		"--kubelet-registrar-directory-path", "/var/lib/kubelet/plugins_registry",
		"--kubelet-plugins-directory-path", "/var/lib/kubelet/plugins",
		"-v", "4",
	}
	if o.featureGates != "" {
		args = append(args, "--feature-gates", o.featureGates)
	}
	if o.http != "" {
		args = append(args, "--http-endpoint", o.http)
	}
	log := filepath.Join(n.NS.Dir, "nvidia-dra-driver.log")
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"unshare", "--mount", "--propagation", "private", "--", "bash", "-ec", nvidiaDRAScript, "nvidia-dra", harness.NodeDriverRoot, bin}, args...)
	cmd := n.NS.NS.Command(context.Background(), argv[0], argv[1:]...)
	// Its documented knob for another sysfs: the simulated node's, which
	// nri-gpu reads too (the PCIe root and NUMA node of each GPU).
	cmd.Env = append(os.Environ(), "NVIDIA_DRA_SYSFS_ROOT="+harness.NodeDriverRoot+"/sys")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	d := &nvidiaDRA{node: n, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(d.done) }()
	if o.cgroup != "" {
		own, err := driverCgroup(o.cgroup, cmd.Process.Pid)
		if err != nil {
			t.Fatalf("NVIDIA's driver's cgroup: %v", err)
		}
		w, _ := os.ReadFile(filepath.Join(own, "cpu.shares"))
		t.Logf("NVIDIA's driver in %s (cpu.shares %s, nri-gpu's container's)", own, strings.TrimSpace(string(w)))
		t.Cleanup(func() { <-d.done; _ = os.Remove(own) })
	}
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("--- node %s: tail of NVIDIA's DRA driver's log ---\n%s", n.Name, d.logTail(6000))
		}
	})
	return d
}

// stop ends the driver (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (d *nvidiaDRA) stop() {
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

// exited reports whether the driver has ended.
func (d *nvidiaDRA) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// logTail is the last n bytes of the driver's log.
func (d *nvidiaDRA) logTail(n int64) string {
	data, err := os.ReadFile(d.log)
	if err != nil {
		return err.Error()
	}
	if int64(len(data)) > n {
		data = data[int64(len(data))-n:]
	}
	return string(data)
}

// waitNVIDIASlice waits until NVIDIA's driver on n publishes a pool of
// want devices, failing early if the driver exits.
func waitNVIDIASlice(k kc, d *nvidiaDRA, want int) {
	k.t.Helper()
	k.wait(2*time.Minute, fmt.Sprintf("NVIDIA's driver publishes %d devices for %s", want, d.node.Name), func() (bool, string, error) {
		if d.exited() {
			return false, "", fmt.Errorf("NVIDIA's driver exited:\n%s", d.logTail(4000))
		}
		got, err := sliceDeviceCounts(k)
		if err != nil {
			return false, err.Error(), nil
		}
		return got[nvidiaDriver+"/"+d.node.Name] == want, fmt.Sprint(got), nil
	})
}
