package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// The cluster's fixed addresses and ports, in its own network namespace.
const (
	clusterBridge  = "nrigpu0"
	clusterSubnet  = "10.233.77.0/24"
	clusterAddress = "10.233.77.1/24" // the bridge's: the API server advertises it
	apiServerPort  = 6443
	// NodeDriverRoot is where each node's simulated GPU node (driver and
	// kernel side) is, in the node's private /run: the path a driver
	// container (NVIDIA's GPU operator) uses, so nri-gpu is installed the
	// way it is for one (driverRoot: /run/nvidia/driver).
	NodeDriverRoot = "/run/nvidia/driver"
	// NodeNRISocket is NRI's default socket, in the node's private /run.
	NodeNRISocket = "/var/run/nri/nri.sock"
	// NodeCDIDir is the node's CDI spec directory for DRA drivers (the
	// kubelet hands the runtime the CDI device IDs of prepared claims),
	// in its private /run; the runtime reads it after its own.
	NodeCDIDir = "/var/run/cdi"
	// cniBinDir holds Debian's containernetworking-plugins.
	cniBinDir = "/usr/lib/cni"
)

// ClusterOptions configures StartCluster.
type ClusterOptions struct {
	// Version is the Kubernetes version ("" = KubernetesVersion).
	Version string
	// Nodes are the worker nodes (at least one).
	Nodes []NodeOptions
	// Images are imported into every node's runtime, next to the standard
	// images (BuildImages).
	Images []*Image
	// Verbosity is the components' -v (default 2).
	Verbosity int
	// ControlPlaneOnly starts no worker node (Nodes must be empty): for
	// nodes of another kind (Node objects a simulator serves).
	ControlPlaneOnly bool
	// ControlPlaneQPS, when set, is the client rate limit (qps and burst)
	// of the scheduler (its KubeSchedulerConfiguration's clientConnection;
	// Kubernetes' default is 50 and 100) and of the controller manager
	// (--kube-api-qps, --kube-api-burst; 20 and 30), so that a throughput
	// bench measures them and not their clients' throttle.
	ControlPlaneQPS int
	// ControllerManagerArgs are added to kube-controller-manager's flags.
	ControllerManagerArgs []string
	// AuditPolicy, when set, is the API server's audit policy (YAML): its
	// events go to Cluster.AuditLog, one JSON object a line.
	AuditPolicy string
}

// NodeOptions is one worker node.
type NodeOptions struct {
	// Name is the node's name (a DNS label).
	Name string
	// Runtime is RuntimeContainerd24 (or another containerd 2.x) or
	// RuntimeCRIO.
	Runtime string
	// GPUs, when set, lays out a simulated GPU node at NodeDriverRoot
	// (DeviceNodes is forced on).
	GPUs *simnode.Options
	// Prepare, when set, runs once the node's namespace and simulated GPUs
	// exist and before its runtime starts: to write files under the node
	// and set o's RuntimeExtraConfig and RuntimeEnv that name them (a
	// runtime handler).
	Prepare func(n *Node, o *NodeOptions) error
	// RuntimeExtraConfig is TOML merged over the runtime's generated
	// config; RuntimeEnv is added to the runtime's environment.
	RuntimeExtraConfig string
	RuntimeEnv         []string
}

// Cluster is a running Kubernetes cluster of its own: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler with real TLS and
// --authorization-mode Node,RBAC (NodeRestriction admission), and worker
// nodes, each a mount namespace of its own with its runtime and kubelet,
// all in one network namespace of their own (Network).
type Cluster struct {
	Opts  ClusterOptions
	Dir   string
	Tools *KubeTools
	// Kubeconfig is the cluster admin's (O=system:masters); kubectl and
	// helm must run in Net (Kubectl, Helm do).
	Kubeconfig string
	Net        *Network
	Nodes      []*Node
	// StartupDuration is StartCluster's time from the first process to
	// every node Ready.
	StartupDuration time.Duration
	// AuditLog is the API server's audit log (with Opts.AuditPolicy).
	AuditLog string

	pki   *pki
	procs []*clusterProc
	mu    sync.Mutex
}

// Node is a worker node of a Cluster.
type Node struct {
	Name    string
	IP      string
	NS      *NodeNamespace
	Runtime Runtime
	Kubelet *Kubelet
	// GPU is the simulated GPU node; GPU.Root is its host path (the node
	// sees it at NodeDriverRoot). Nil without GPUs.
	GPU *simnode.Node
}

// HostPath is where the host sees p, a path as the node sees it.
func (n *Node) HostPath(p string) string { return n.NS.HostPath(p) }

// clusterProc is a control plane process.
type clusterProc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *os.File
}

// StartCluster starts a cluster with opts.Nodes, building the binaries it
// needs on first use (InstallKubeTools, InstallTools, InstallCRIO,
// BuildImages), and returns once every node is Ready. On error what was
// started is stopped again.
func StartCluster(ctx context.Context, opts ClusterOptions) (*Cluster, error) {
	if len(opts.Nodes) == 0 && !opts.ControlPlaneOnly {
		return nil, errors.New("ClusterOptions.Nodes: at least one node")
	}
	if len(opts.Nodes) > 0 && opts.ControlPlaneOnly {
		return nil, errors.New("ClusterOptions: ControlPlaneOnly with Nodes")
	}
	if opts.Verbosity == 0 {
		opts.Verbosity = 2
	}
	kt, err := InstallKubeTools(ctx, "", opts.Version)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(cniBinDir, "bridge")); err != nil {
		if err := aptInstall(ctx, "containernetworking-plugins"); err != nil {
			return nil, fmt.Errorf("the nodes' pod network needs Debian's containernetworking-plugins in %s: %w", cniBinDir, err)
		}
	}
	dir, err := os.MkdirTemp("", "nrie2e-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Opts: opts, Dir: dir, Tools: kt}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	begin := time.Now()
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	c.StartupDuration = time.Since(begin)
	return c, nil
}

// start makes the network, the certificates and the control plane, then
// the nodes (side by side), and waits for them to be Ready.
func (c *Cluster) start(ctx context.Context) error {
	var err error
	if c.Net, err = StartNetwork(ctx, c.Dir, clusterBridge, clusterAddress); err != nil {
		return err
	}
	if err := c.makePKI(); err != nil {
		return err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	c.Nodes = make([]*Node, len(c.Opts.Nodes))
	errs := make([]error, len(c.Opts.Nodes))
	var wg sync.WaitGroup
	for i := range c.Opts.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Nodes[i], errs[i] = c.startNode(ctx, i)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := c.WaitNodeReady(ctx, n.Name, 2*time.Minute); err != nil {
			return fmt.Errorf("%w\n--- tail of %s ---\n%s", err, n.Kubelet.LogPath, n.Kubelet.LogTail(4000))
		}
	}
	return nil
}

// nodeIP is node i's address on the bridge.
func nodeIP(i int) string { return fmt.Sprintf("10.233.77.%d", 11+i) }

// makePKI issues every certificate of the cluster.
func (c *Cluster) makePKI() error {
	p, err := newPKI(filepath.Join(c.Dir, "pki"))
	if err != nil {
		return err
	}
	c.pki = p
	specs := []certSpec{
		{name: "etcd", cn: "etcd", server: true, client: true, ips: []string{"127.0.0.1"}, dns: []string{"localhost"}},
		{name: "apiserver-etcd-client", cn: "kube-apiserver-etcd-client", client: true},
		{name: "apiserver", cn: "kube-apiserver", server: true, ips: []string{"127.0.0.1", "10.96.0.1", c.Net.IP()},
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}, client: true},
		{name: "admin", cn: "kubernetes-admin", orgs: []string{"system:masters"}, client: true},
		{name: "controller-manager", cn: "system:kube-controller-manager", client: true},
		{name: "scheduler", cn: "system:kube-scheduler", client: true},
	}
	for i, n := range c.Opts.Nodes {
		specs = append(specs,
			certSpec{name: "node-" + n.Name, cn: "system:node:" + n.Name, orgs: []string{"system:nodes"}, client: true},
			certSpec{name: "kubelet-" + n.Name, cn: n.Name, server: true, ips: []string{nodeIP(i)}, dns: []string{n.Name}})
	}
	for _, s := range specs {
		if err := p.issue(s); err != nil {
			return err
		}
	}
	if err := p.serviceAccountKeys(); err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", apiServerPort)
	for _, name := range []string{"admin", "controller-manager", "scheduler"} {
		if _, err := p.kubeconfig(name, server); err != nil {
			return err
		}
	}
	for _, n := range c.Opts.Nodes {
		if _, err := p.kubeconfig("node-"+n.Name, server); err != nil {
			return err
		}
	}
	c.Kubeconfig = p.path("admin", ".kubeconfig")
	return nil
}

// startControlPlane runs etcd, then kube-apiserver (until /readyz), then
// the controller manager and the scheduler.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	p := c.pki
	v := strconv.Itoa(c.Opts.Verbosity)
	if err := c.run("etcd", c.Tools.Etcd, "--name", "e2e", "--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", "https://127.0.0.1:2379", "--advertise-client-urls", "https://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "e2e=http://127.0.0.1:2380", "--listen-metrics-urls", "http://127.0.0.1:2381",
		"--cert-file", p.path("etcd", ".crt"), "--key-file", p.path("etcd", ".key"),
		"--client-cert-auth", "--trusted-ca-file", p.path("ca", ".crt"),
		// A test cluster on a shared disk: no fsync per write.
		"--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return err
	}
	audit, err := c.auditArgs()
	if err != nil {
		return err
	}
	if err := c.run("kube-apiserver", c.Tools.APIServer, append([]string{"-v", v,
		"--etcd-servers", "https://127.0.0.1:2379", "--etcd-cafile", p.path("ca", ".crt"),
		"--etcd-certfile", p.path("apiserver-etcd-client", ".crt"), "--etcd-keyfile", p.path("apiserver-etcd-client", ".key"),
		"--secure-port", strconv.Itoa(apiServerPort), "--advertise-address", c.Net.IP(),
		"--tls-cert-file", p.path("apiserver", ".crt"), "--tls-private-key-file", p.path("apiserver", ".key"),
		"--client-ca-file", p.path("ca", ".crt"),
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p.path("sa", ".pub"), "--service-account-signing-key-file", p.path("sa", ".key"),
		"--service-cluster-ip-range", "10.96.0.0/24", "--endpoint-reconciler-type", "none",
		"--kubelet-client-certificate", p.path("apiserver-kubelet-client", ".crt"),
		"--kubelet-client-key", p.path("apiserver-kubelet-client", ".key"),
		"--kubelet-certificate-authority", p.path("ca", ".crt"),
		"--kubelet-preferred-address-types", "InternalIP,Hostname"}, audit...)...); err != nil {
		return err
	}
	if err := c.waitAPIServer(ctx, 2*time.Minute); err != nil {
		return err
	}
	cm := p.path("controller-manager", ".kubeconfig")
	cmArgs := []string{"-v", v,
		"--kubeconfig", cm, "--authentication-kubeconfig", cm, "--authorization-kubeconfig", cm,
		"--use-service-account-credentials", "--root-ca-file", p.path("ca", ".crt"),
		"--service-account-private-key-file", p.path("sa", ".key"),
		"--cluster-signing-cert-file", p.path("ca", ".crt"), "--cluster-signing-key-file", p.path("ca", ".key"),
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "10257"}
	if q := c.Opts.ControlPlaneQPS; q > 0 {
		cmArgs = append(cmArgs, "--kube-api-qps", strconv.Itoa(q), "--kube-api-burst", strconv.Itoa(q))
	}
	if err := c.run("kube-controller-manager", c.Tools.ControllerManager, append(cmArgs, c.Opts.ControllerManagerArgs...)...); err != nil {
		return err
	}
	sc := p.path("scheduler", ".kubeconfig")
	args := []string{"-v", v, "--kubeconfig", sc, "--authentication-kubeconfig", sc, "--authorization-kubeconfig", sc,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "10259"}
	if q := c.Opts.ControlPlaneQPS; q > 0 {
		// With --config the scheduler ignores --kubeconfig and
		// --leader-elect: the file says them.
		cfg := filepath.Join(c.Dir, "kube-scheduler.yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
clientConnection:
  kubeconfig: %s
  qps: %d
  burst: %d
`, sc, q, q)), 0o644); err != nil {
			return err
		}
		args = append(args, "--config", cfg)
	}
	return c.run("kube-scheduler", c.Tools.Scheduler, args...)
}

// auditArgs are the API server's audit flags for Opts.AuditPolicy (none
// without it), the policy written beside the log.
func (c *Cluster) auditArgs() ([]string, error) {
	if c.Opts.AuditPolicy == "" {
		return nil, nil
	}
	policy := filepath.Join(c.Dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(c.Opts.AuditPolicy), 0o644); err != nil {
		return nil, err
	}
	c.AuditLog = filepath.Join(c.Dir, "audit.log")
	return []string{"--audit-policy-file", policy, "--audit-log-path", c.AuditLog, "--audit-log-format", "json",
		"--audit-log-mode", "blocking", "--audit-log-maxsize", "0"}, nil
}

// Signal sends sig to the control plane process name ("kube-scheduler",
// ...): SIGSTOP and SIGCONT pause and resume it.
func (c *Cluster) Signal(name string, sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.name == name {
			return p.cmd.Process.Signal(sig)
		}
	}
	return fmt.Errorf("no control plane process %s", name)
}

// PID is the process id of the control plane process name, 0 if none.
func (c *Cluster) PID(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.name == name {
			return p.cmd.Process.Pid
		}
	}
	return 0
}

// Start runs another process in the cluster's network namespace (a node
// simulator), its output in <Dir>/<name>.log; Stop ends it before the
// control plane.
func (c *Cluster) Start(name, bin string, args ...string) error { return c.run(name, bin, args...) }

// run starts a control plane process in the cluster's network namespace,
// its output in <Dir>/<name>.log.
func (c *Cluster) run(name, bin string, args ...string) error {
	logf, err := os.Create(filepath.Join(c.Dir, name+".log"))
	if err != nil {
		return err
	}
	argv := c.Net.NS.Wrap(append([]string{bin}, args...))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.Dir
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &clusterProc{name: name, cmd: cmd, exited: make(chan struct{}), log: logf}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return nil
}

// LogTail is the last n bytes of a control plane component's log
// ("kube-apiserver", "kube-scheduler", ...).
func (c *Cluster) LogTail(name string, n int64) string {
	return fileTail(filepath.Join(c.Dir, name+".log"), n)
}

// waitAPIServer waits until the API server's /readyz answers ok.
func (c *Cluster) waitAPIServer(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.Kubectl(ctx, "get", "--raw", "/readyz")
		if err == nil && strings.TrimSpace(out) == "ok" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("kube-apiserver not ready: %v\n--- tail of kube-apiserver.log ---\n%s\n--- etcd.log ---\n%s", err,
				c.LogTail("kube-apiserver", 4000), c.LogTail("etcd", 2000))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// startNode starts worker node i: its namespace, simulated GPUs, CNI
// configuration, runtime (images imported) and kubelet.
func (c *Cluster) startNode(ctx context.Context, i int) (*Node, error) {
	o := c.Opts.Nodes[i]
	n := &Node{Name: o.Name, IP: nodeIP(i)}
	dir, err := os.MkdirTemp("", "nrie2e-node-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	if err := c.Net.AddAddress(ctx, n.IP+"/24"); err != nil {
		return nil, err
	}
	if n.NS, err = StartNodeNamespace(ctx, c.Net, dir); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	// Registered before anything else can fail: Stop tears it down.
	c.mu.Lock()
	c.Nodes[i] = n
	c.mu.Unlock()
	if o.GPUs != nil {
		g := *o.GPUs
		g.DeviceNodes = true
		if n.GPU, err = simnode.Generate(n.HostPath(NodeDriverRoot), g); err != nil {
			return n, err
		}
		if err := copyBootID(n.GPU.Root); err != nil {
			return n, err
		}
	}
	if o.Prepare != nil {
		if err := o.Prepare(n, &o); err != nil {
			return n, err
		}
	}
	cni := filepath.Join(dir, "cni")
	if err := writeCNIConfig(cni, i); err != nil {
		return n, err
	}
	// The CDI directory of DRA drivers, in the node's private /run, made
	// before the runtime starts watching it.
	if err := os.MkdirAll(n.HostPath(NodeCDIDir), 0o755); err != nil {
		return n, err
	}
	node := &NodeRuntime{NS: n.NS.NS, NRISocket: n.HostPath(NodeNRISocket), CNIBinDirs: []string{cniBinDir}, CNIConfDir: cni, CDIDirs: []string{NodeCDIDir}}
	if n.Runtime, err = startNodeRuntime(ctx, o, node, c.Opts.Images); err != nil {
		return n, err
	}
	ep, ok := n.Runtime.(CRIEndpointer)
	if !ok {
		return n, fmt.Errorf("node %s: runtime %s has no CRI endpoint", n.Name, o.Runtime)
	}
	p := c.pki
	n.Kubelet, err = startNodeKubelet(nodeKubeletOptions{
		Binary: c.Tools.Kubelet, Runtime: ep, NS: n.NS, NodeName: n.Name, NodeIP: n.IP,
		Kubeconfig: p.path("node-"+n.Name, ".kubeconfig"), CAFile: p.path("ca", ".crt"),
		CertFile: p.path("kubelet-"+n.Name, ".crt"), KeyFile: p.path("kubelet-"+n.Name, ".key"),
		HealthzPort: 10300 + i, Verbosity: c.Opts.Verbosity,
	})
	return n, err
}

// copyBootID writes the host's boot id into the simulated node at root,
// as a node's /proc has it: nri-gpu records it with its /dev/char links
// (a record of another boot is stale), and the shell command of
// docs/install.md that removes them compares it with /proc's.
func copyBootID(root string) error {
	id, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return err
	}
	p := filepath.Join(root, "proc", "sys", "kernel", "random", "boot_id")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, id, 0o444)
}

// writeCNIConfig writes node i's CNI configuration into dir: Debian's
// containernetworking-plugins bridge on the cluster's bridge, no gateway
// and no masquerading (nothing changes on the host's network), host-local
// addresses from a range of its own (the node's 64 addresses from .64 on).
func writeCNIConfig(dir string, i int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lo := 64 * (i + 1)
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "nri-gpu-e2e",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": clusterBridge, "isGateway": false, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type": "host-local",
					"ranges": []any{[]any{map[string]any{
						"subnet": clusterSubnet, "rangeStart": fmt.Sprintf("10.233.77.%d", lo), "rangeEnd": fmt.Sprintf("10.233.77.%d", lo+63),
					}}},
				},
			},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "10-nri-gpu-e2e.conflist"), data, 0o644)
}

// startNodeRuntime starts o's runtime on a node with the standard images
// and extra imported.
func startNodeRuntime(ctx context.Context, o NodeOptions, node *NodeRuntime, extra []*Image) (Runtime, error) {
	name := o.Runtime
	imgs, err := BuildImages(ctx, "")
	if err != nil {
		return nil, err
	}
	switch {
	case name == RuntimeCRIO:
		tools, err := InstallTools(ctx, "", "")
		if err != nil {
			return nil, err
		}
		crio, err := InstallCRIO(ctx, "")
		if err != nil {
			return nil, err
		}
		return StartCRIO(ctx, CRIOOptions{Tools: tools, CRIO: crio, Images: imgs, ExtraImages: extra, Node: node,
			ExtraConfig: o.RuntimeExtraConfig, Env: o.RuntimeEnv})
	case strings.HasPrefix(name, "containerd-2."):
		tools, err := InstallTools(ctx, "", ContainerdVersionOf(name))
		if err != nil {
			return nil, err
		}
		return StartContainerd(ctx, ContainerdOptions{Tools: tools, Images: imgs, ExtraImages: extra, Node: node,
			ExtraConfig: o.RuntimeExtraConfig, Env: o.RuntimeEnv})
	default:
		return nil, fmt.Errorf("node runtime %q: want %s, %s or %s", name, RuntimeContainerd24, RuntimeContainerd22, RuntimeCRIO)
	}
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n != nil && n.Name == name {
			return n
		}
	}
	return nil
}

// Stop tears the cluster down: each node's kubelet, runtime (its pods and
// containers) and namespace, then the control plane, the network, and
// every directory. Safe to call more than once.
func (c *Cluster) Stop() error {
	var errs []error
	for _, n := range c.Nodes {
		if n == nil {
			continue
		}
		if n.Kubelet != nil {
			if err := n.Kubelet.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("node %s: kubelet: %w", n.Name, err))
			}
		}
		if n.Runtime != nil {
			if err := n.Runtime.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("node %s: %s: %w", n.Name, n.Runtime.Name(), err))
			}
		}
		if n.NS != nil {
			n.NS.Stop()
			if err := CleanupDir(n.NS.Dir, ""); err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			}
		}
	}
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		p.log.Close()
	}
	if c.Net != nil {
		c.Net.Stop()
	}
	if err := CleanupDir(c.Dir, ""); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
