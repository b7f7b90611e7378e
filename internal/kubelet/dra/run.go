package dra

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/ops/kubeapi"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
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
