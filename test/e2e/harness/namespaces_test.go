package harness

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// peerGroups are the propagation peer groups (shared:N, master:N) of the
// mounts in a mountinfo file.
func peerGroups(t *testing.T, mountinfo string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		fields := strings.Fields(l)
		for _, f := range fields {
			if f == "-" {
				break
			}
			if strings.HasPrefix(f, "shared:") || strings.HasPrefix(f, "master:") {
				groups[strings.SplitN(f, ":", 2)[1]] = true
			}
		}
	}
	return groups
}

// TestNodeNamespace: a node's /run, /var/lib and /var/log are its own
// directories, and none of its mounts is a peer of (or a slave to) a mount
// of the host's namespace, so nothing mounted or unmounted on either side
// propagates to the other: the cluster and another phase (the kubelet's
// shared root directory) cannot disturb each other.
func TestNodeNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes network and mount namespaces")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	net, err := StartNetwork(ctx, dir, "nrigpu-t0", "10.233.78.1/24")
	if err != nil {
		t.Fatal(err)
	}
	defer net.Stop()
	// A shared mount of the host's, made before the node (as the kubelet
	// phase makes its root directory a shared bind of itself), is copied
	// into the node's namespace as a private mount: no peer of it.
	shared := filepath.Join(dir, "shared")
	if err := os.MkdirAll(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-c", "mount --bind "+shared+" "+shared+" && mount --make-shared "+shared).CombinedOutput(); err != nil {
		t.Fatalf("host bind: %v: %s", err, out)
	}
	defer func() { _ = UnmountAll(shared) }()
	nodeDir := filepath.Join(dir, "node")
	if err := os.MkdirAll(nodeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	n, err := StartNodeNamespace(ctx, net, nodeDir)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	// A file the node writes in its /run, /var/lib and /var/log is in its
	// directory on the host, not in the host's.
	for _, p := range []string{"/run/nri-gpu-e2e-probe", "/var/lib/kubelet/probe", "/var/log/pods/probe"} {
		if out, err := n.NS.Command(ctx, "sh", "-c", "mkdir -p $(dirname "+p+") && echo x > "+p).CombinedOutput(); err != nil {
			t.Fatalf("writing %s in the node: %v: %s", p, err, out)
		}
		if _, err := os.Stat(n.HostPath(p)); err != nil {
			t.Errorf("%s written in the node is not at %s: %v", p, n.HostPath(p), err)
		}
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s written in the node is on the host", p)
		}
	}
	node := peerGroups(t, "/proc/"+strconv.Itoa(n.NS.PID)+"/mountinfo")
	host := peerGroups(t, "/proc/self/mountinfo")
	for g := range node {
		if host[g] {
			t.Errorf("peer group %s is in the node's namespace and the host's", g)
		}
	}
	if len(host) == 0 {
		t.Error("no shared mount on the host: the check proves nothing")
	}
	// A mount the host makes afterwards under the shared one does not
	// reach the node.
	later := filepath.Join(shared, "later")
	if err := os.MkdirAll(later, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "tmpfs", later).CombinedOutput(); err != nil {
		t.Fatalf("host tmpfs: %v: %s", err, out)
	}
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(n.NS.PID) + "/mountinfo")
	if strings.Contains(string(data), " "+later+" ") {
		t.Errorf("the host's later mount %s propagated into the node's namespace", later)
	}
}

// TestBridgeMAC: the bridge keeps its own MAC while ports come and go
// (pods' veths, each with a random MAC, some lower than the bridge's): a
// bridge without one takes its lowest port's, and pods' connections to
// the control plane stall when it changes.
func TestBridgeMAC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a network namespace")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	net, err := StartNetwork(ctx, t.TempDir(), "nrigpu-t1", "10.233.79.1/24")
	if err != nil {
		t.Fatal(err)
	}
	defer net.Stop()
	// Ports with MACs below and above the bridge's, the lowest removed
	// last: each step changes an unpinned bridge's MAC.
	script := `set -e
for m in 02:00:00:00:00:05 02:00:00:00:00:01 fe:00:00:00:00:01; do
  i=$((i+1)); ip link add v$i address $m type veth peer name p$i; ip link set v$i master nrigpu-t1 up
  ip -br link show nrigpu-t1
done
ip link del v2; ip -br link show nrigpu-t1
ip link del v1; ip -br link show nrigpu-t1`
	out, err := net.NS.Command(ctx, "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 5 {
		t.Fatalf("want 5 lines of ip link:\n%s", out)
	}
	for _, l := range lines {
		if !strings.Contains(l, " "+BridgeMAC+" ") {
			t.Errorf("the bridge's MAC moved (want %s throughout):\n%s", BridgeMAC, out)
			break
		}
	}
}
