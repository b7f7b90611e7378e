package dra

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/ops/kubeapi"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// Run runs the DRA kubelet plugin of n's configuration until ctx ends:
// the dra key, the node's name from NodeNameEnv, the API server through
// dra.kubeconfig or the pod's service account. A configuration that
// offers a GPU of the node to the device plugin too is refused. book is
// Options.Book: the NRI side's allocation table.
func Run(ctx context.Context, n *node.Node, log *logrus.Logger, book func(*claims.Prepared, string) error) error {
	st := n.State()
	cfg := st.Config
	if err := cfg.OverlapOn(st.Snapshot().GPUs); err != nil {
		return fmt.Errorf("start DRA: %w", err)
	}
	client, err := kubeClient(cfg.DRA.Kubeconfig)
	if err != nil {
		return fmt.Errorf("start DRA: %w", err)
	}
	mig, closeMIG := openMIG(st, log)
	defer closeMIG()
	d, err := New(Options{
		DriverName:      cfg.DRA.DriverName,
		NodeName:        os.Getenv(NodeNameEnv),
		PluginDir:       cfg.DRA.PluginDir,
		RegistrationDir: cfg.DRA.RegistrationDir,
		CDIDir:          cfg.DRA.CDIDir,
		DevRoot:         cfg.DevicePlugin.DevRoot,
		SysRoot:         filepath.Join(cfg.HostRoot, "sys"),
		MPSRoot:         cfg.DevicePlugin.MPSRoot,
		Book:            book,
		MIG:             mig,
	}, n, client, log)
	if err != nil {
		return err
	}
	return d.Serve(ctx)
}

// kubeClient returns a client of the API server (kubeapi.Config).
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := kubeapi.Config(kubeconfig)
	if err != nil {
		return nil, err
	}
	return newClientset(cfg)
}

// openMIG opens NVML for dra.dynamicMIG: nil (and a warning) when it is
// off, or NVML cannot be opened or make MIG devices; the GPUs of
// dra.dynamicMIG are then not published.
func openMIG(st *node.State, log *logrus.Logger) (nvml.MIGMaker, func()) {
	if !st.Config.DRA.DynamicMIG.Enabled() {
		return nil, func() {}
	}
	path := node.NVMLPath(st.Config, st.Snapshot())
	if path == "" {
		log.Warn("DRA: dra.dynamicMIG: discovery found no libnvidia-ml.so.1; MIG devices are not made on demand")
		return nil, func() {}
	}
	lib, err := nvml.Open(path)
	if err != nil {
		log.WithError(err).Warn("DRA: dra.dynamicMIG: NVML cannot be opened; MIG devices are not made on demand")
		return nil, func() {}
	}
	mk, ok := lib.(nvml.MIGMaker)
	if !ok {
		_ = lib.Close()
		return nil, func() {}
	}
	warnWithoutSysAdmin(log)
	return mk, func() { _ = lib.Close() }
}

// warnWithoutSysAdmin says, at start, when nri-gpu lacks CAP_SYS_ADMIN
// (its effective set, as the driver's os_is_administrator reads it):
// NVML will refuse every MIG device a claim needs, and the log says why
// before the first claim fails.
func warnWithoutSysAdmin(log *logrus.Logger) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil || caps[0].Effective&(1<<unix.CAP_SYS_ADMIN) == 0 {
		log.WithError(err).Warn("DRA: dra.dynamicMIG: nri-gpu runs without CAP_SYS_ADMIN, and NVIDIA's driver makes MIG devices for an administrator only: " +
			"claims of MIG devices made on demand will fail at prepare (the chart adds SYS_ADMIN and MKNOD with config.dra.dynamicMIG.devices; " +
			"kubectl apply -k: the component deploy/kubernetes-dra-dynamic-mig)")
	}
}
