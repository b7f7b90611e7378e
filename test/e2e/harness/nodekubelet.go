package harness

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
)

// nodeKubeletOptions configures a cluster node's kubelet.
type nodeKubeletOptions struct {
	Binary     string
	Runtime    CRIEndpointer
	NS         *NodeNamespace
	NodeName   string
	NodeIP     string
	Kubeconfig string // the node's client certificate (system:node:<name>)
	CAFile     string // clients' CA (the API server's kubelet client)
	CertFile   string // serving certificate for NodeIP
	KeyFile    string
	// HealthzPort is the kubelet's healthz port on 127.0.0.1 in the
	// cluster's network namespace (one per node).
	HealthzPort int
	Verbosity   int
	// FeatureGates is the kubelet's --feature-gates ("" none).
	FeatureGates string
}

// startNodeKubelet starts a cluster node's kubelet in the node's
// namespaces: its root directory is the node's private /var/lib/kubelet
// (so device-plugins and plugins_registry are the node's own), pod logs in
// its /var/log/pods, registered with the API server as NodeName with
// NodeIP, serving on NodeIP:10250 with real TLS, webhook authentication
// and authorization (kubectl exec and logs go through the API server).
// The cluster waits for the Node to be Ready. Its read-only port is off
// (as on a real node): read pods from the API server, not Kubelet.Pods.
func startNodeKubelet(o nodeKubeletOptions) (*Kubelet, error) {
	if o.Binary == "" || o.Runtime == nil || o.NS == nil {
		return nil, errors.New("node kubelet: Binary, Runtime and NS are required")
	}
	if o.Verbosity == 0 {
		o.Verbosity = 2
	}
	dir := filepath.Join(o.NS.Dir, "kubelet")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	k := &Kubelet{
		Opts:        KubeletOptions{Binary: o.Binary, Runtime: o.Runtime, NodeName: o.NodeName, Verbosity: o.Verbosity},
		Dir:         dir,
		RootDir:     "/var/lib/kubelet",
		CertDir:     filepath.Join(dir, "pki"),
		ConfigPath:  filepath.Join(dir, "kubelet.yaml"),
		LogPath:     filepath.Join(dir, "kubelet.log"),
		Port:        10250,
		HealthzPort: o.HealthzPort,
		ns:          o.NS.NS,
		exited:      make(chan struct{}),
	}
	endpoint := o.Runtime.CRIEndpoint()
	cfg := map[string]any{
		"apiVersion":                "kubelet.config.k8s.io/v1beta1",
		"kind":                      "KubeletConfiguration",
		"containerRuntimeEndpoint":  endpoint,
		"imageServiceEndpoint":      endpoint,
		"cgroupDriver":              "cgroupfs",
		"cgroupsPerQOS":             false,
		"enforceNodeAllocatable":    []string{},
		"failSwapOn":                false,
		"failCgroupV1":              false,
		"address":                   o.NodeIP,
		"port":                      k.Port,
		"readOnlyPort":              0,
		"healthzBindAddress":        "127.0.0.1",
		"healthzPort":               o.HealthzPort,
		"tlsCertFile":               o.CertFile,
		"tlsPrivateKeyFile":         o.KeyFile,
		"rotateCertificates":        false,
		"serverTLSBootstrap":        false,
		"authentication":            map[string]any{"anonymous": map[string]any{"enabled": false}, "webhook": map[string]any{"enabled": true}, "x509": map[string]any{"clientCAFile": o.CAFile}},
		"authorization":             map[string]any{"mode": "Webhook"},
		"clusterDomain":             "cluster.local",
		"syncFrequency":             "5s",
		"nodeStatusUpdateFrequency": "4s",
		// Low thresholds: the machine's disk and memory are shared with
		// everything else; the cluster must not evict pods on its own.
		"evictionHard":                     map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
		"evictionPressureTransitionPeriod": "1s",
		"imageGCHighThresholdPercent":      100,
		"imageGCLowThresholdPercent":       99,
		"resolvConf":                       "",
		"registerNode":                     true,
		"serializeImagePulls":              false,
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(k.ConfigPath, data, 0o644); err != nil {
		return nil, err
	}
	k.args = []string{"--config", k.ConfigPath, "--kubeconfig", o.Kubeconfig, "--root-dir", k.RootDir, "--cert-dir", k.CertDir,
		"--hostname-override", o.NodeName, "--node-ip", o.NodeIP, "-v", strconv.Itoa(o.Verbosity)}
	if o.FeatureGates != "" {
		k.args = append(k.args, "--feature-gates", o.FeatureGates)
	}
	if err := k.start(); err != nil {
		return nil, err
	}
	return k, nil
}
