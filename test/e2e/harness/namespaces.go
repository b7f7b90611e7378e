package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Namespaces names the namespaces of a holder process that commands run
// in: a cluster's network namespace and, for a node, its mount namespace.
// A nil *Namespaces is the host's.
type Namespaces struct {
	PID   int // the holder process
	Mount bool
	Net   bool
}

// Wrap returns argv run in the namespaces (through nsenter, which execs
// argv in its own process: the pid is argv's).
func (n *Namespaces) Wrap(argv []string) []string {
	if n == nil {
		return argv
	}
	a := []string{"nsenter", "-t", strconv.Itoa(n.PID)}
	if n.Mount {
		a = append(a, "-m")
	}
	if n.Net {
		a = append(a, "-n")
	}
	return append(append(a, "--"), argv...)
}

// Command is exec.CommandContext of name and args in the namespaces.
func (n *Namespaces) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := n.Wrap(append([]string{name}, args...))
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// NodeRuntime is what a CRI runtime on a cluster node takes from the node:
// the namespaces it runs in, NRI's socket (the default path, in the node's
// private /run), the CNI plugins and configuration of pod networks, and
// the node's CDI spec directories (where a DRA driver on the node writes
// the specs of prepared claims: /var/run/cdi), read after the runtime's
// own.
type NodeRuntime struct {
	NS         *Namespaces
	NRISocket  string
	CNIBinDirs []string
	CNIConfDir string
	CDIDirs    []string
}

func (n *NodeRuntime) namespaces() *Namespaces {
	if n == nil {
		return nil
	}
	return n.NS
}

// cdiDirs are the runtime's CDI spec directories: its own, then the
// node's.
func (n *NodeRuntime) cdiDirs(own string) []string {
	if n == nil {
		return []string{own}
	}
	return append([]string{own}, n.CDIDirs...)
}

// holder is a process that only keeps namespaces alive. Its argv[0] is a
// path under its directory, so CleanupDir and ReapStale find and end it.
type holder struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startHolder runs script with bash under argv (unshare, nsenter ...): the
// script sets the namespaces up, then must `exec -a "$0" sleep infinity`
// after printing "ready". $0 is dir/name; $1 is dir.
func startHolder(ctx context.Context, dir, name string, argv []string, script string) (*holder, error) {
	full := append(append([]string{}, argv...), "bash", "-ec", script+"\necho ready\nexec -a \"$0\" sleep infinity", filepath.Join(dir, name), dir)
	cmd := exec.Command(full[0], full[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	h := &holder{cmd: cmd, exited: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if sc.Text() == "ready" && !ok {
				ok = true
				ready <- nil
			}
		}
		if !ok {
			ready <- errors.New("exited before it was ready")
		}
	}()
	go func() { _ = cmd.Wait(); logf.Close(); close(h.exited) }()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(30 * time.Second):
		err = errors.New("not ready within 30s")
	}
	if err != nil {
		h.stop()
		return nil, fmt.Errorf("%s: %w: %s", name, err, fileTail(filepath.Join(dir, name+".log"), 2000))
	}
	return h, nil
}

// pid is the holder's process id.
func (h *holder) pid() int { return h.cmd.Process.Pid }

// stop kills the holder and waits for it. The namespaces end when the last
// process in them has.
func (h *holder) stop() {
	if h == nil || h.cmd.Process == nil {
		return
	}
	_ = h.cmd.Process.Kill()
	select {
	case <-h.exited:
	case <-time.After(10 * time.Second):
	}
}

// Network is a network namespace of its own for a cluster: its loopback,
// and one bridge with the addresses of the control plane and the nodes,
// that the nodes' pods join through CNI. Nothing of it is on the host's
// network: two clusters (a test and a demo) can run side by side, and
// ports inside are fixed.
type Network struct {
	NS     *Namespaces // network only
	Dir    string
	Bridge string // the bridge's name
	// Address is the bridge's first address, the control plane's (with its
	// prefix length: "10.233.77.1/24").
	Address string
	h       *holder
}

// BridgeMAC is the bridge's own MAC address, set when it is made. A Linux
// bridge without one takes the lowest MAC of its ports and changes it as
// pods' veths come and go; a pod's ARP entry for the control plane then
// names a MAC the bridge no longer answers, and its connections to the API
// server stall until the entry expires (up to 45 s, and TCP's backoff on
// top): at a pod start a second, nri-gpu's claim prepares stopped for 46 s.
// The CNI bridge plugin pins the MAC the same way when it owns the gateway
// address; here the harness owns it (isGateway: false).
const BridgeMAC = "02:6e:72:67:00:01"

// StartNetwork makes the network namespace under dir (which must exist)
// with the bridge and address (CIDR form).
func StartNetwork(ctx context.Context, dir, bridge, address string) (*Network, error) {
	script := fmt.Sprintf(`ip link set lo up
ip link add %[1]s address %[3]s type bridge
ip addr add %[2]s dev %[1]s
ip link set %[1]s up`, bridge, address, BridgeMAC)
	h, err := startHolder(ctx, dir, "net-holder", []string{"unshare", "--net", "--"}, script)
	if err != nil {
		return nil, err
	}
	return &Network{NS: &Namespaces{PID: h.pid(), Net: true}, Dir: dir, Bridge: bridge, Address: address, h: h}, nil
}

// IP is the bridge's first address without its prefix length.
func (n *Network) IP() string {
	ip, _, _ := strings.Cut(n.Address, "/")
	return ip
}

// AddAddress adds an address (CIDR form) to the bridge, e.g. a node's.
func (n *Network) AddAddress(ctx context.Context, address string) error {
	if out, err := n.NS.Command(ctx, "ip", "addr", "add", address, "dev", n.Bridge).CombinedOutput(); err != nil {
		return fmt.Errorf("ip addr add %s: %w: %s", address, err, out)
	}
	return nil
}

// Stop ends the namespace's holder.
func (n *Network) Stop() { n.h.stop() }

// NodeNamespace is a node's mount namespace, inside a Network: a private
// /run (and so /var/run: NRI's socket, the runtime's state, a driver root
// at /run/nvidia/driver), /var/lib (the kubelet's /var/lib/kubelet with
// its hard-wired device-plugins and plugins_registry, CNI's IP
// allocations) and /var/log (pod logs), each a directory under Dir. It
// starts from a private copy of the host's mounts, so nothing mounted in
// it propagates to the host or to another node, and nothing the host
// mounts later (another phase's kubelet, another test's runtime) comes in:
// no mount of it is a peer of a mount outside. Inside, / is then made
// rshared, so that mounts the node makes reach its containers
// (mountPropagation: HostToContainer).
type NodeNamespace struct {
	NS  *Namespaces // mount and network
	Dir string
	h   *holder
}

// Node namespace directories under NodeNamespace.Dir, bound over the
// node's /run, /var/lib and /var/log.
const (
	nodeRunDir = "run"
	nodeLibDir = "lib"
	nodeLogDir = "log"
)

// StartNodeNamespace makes a node's mount namespace in net's network
// namespace, with its directories under dir (which must exist).
func StartNodeNamespace(ctx context.Context, net *Network, dir string) (*NodeNamespace, error) {
	for _, d := range []string{nodeRunDir, nodeLibDir, nodeLogDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	script := fmt.Sprintf(`mount --bind "$1/%s" /run
mount --bind "$1/%s" /var/lib
mount --bind "$1/%s" /var/log
mount --make-rshared /`, nodeRunDir, nodeLibDir, nodeLogDir)
	argv := net.NS.Wrap([]string{"unshare", "--mount", "--propagation", "private", "--"})
	h, err := startHolder(ctx, dir, "node-holder", argv, script)
	if err != nil {
		return nil, err
	}
	return &NodeNamespace{NS: &Namespaces{PID: h.pid(), Mount: true, Net: true}, Dir: dir, h: h}, nil
}

// HostPath is where the host sees p, a path under the node's /run,
// /var/lib or /var/log ("/run/nvidia/driver" -> Dir/run/nvidia/driver);
// other paths are the host's own.
func (n *NodeNamespace) HostPath(p string) string {
	for _, m := range []struct{ in, dir string }{{"/var/run", nodeRunDir}, {"/run", nodeRunDir}, {"/var/lib", nodeLibDir}, {"/var/log", nodeLogDir}} {
		if p == m.in || strings.HasPrefix(p, m.in+"/") {
			return filepath.Join(n.Dir, m.dir, strings.TrimPrefix(p, m.in))
		}
	}
	return p
}

// Stop ends the namespace's holder; the namespace and its mounts end with
// the last process in it.
func (n *NodeNamespace) Stop() { n.h.stop() }
