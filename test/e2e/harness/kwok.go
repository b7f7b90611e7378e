package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// KwokVersion is sigs.k8s.io/kwok, the node simulator of the scale bench
// (keep in sync with test/e2e/install-cluster.sh):
// it serves Node objects (heartbeats, leases) and runs the pods bound to
// them (Pending to Running) without a kubelet or runtime.
const KwokVersion = "v0.8.0"

// Kwok is kwok's binary and its stage files: how nodes and pods move
// through their lifecycle (kwok's own kustomize/stage files, from its
// module in the module cache).
type Kwok struct {
	Bin    string
	Stages []string
}

// kwokStages are kwok's stage files the bench runs with: nodes are made
// Ready and keep their leases; pods go to Running and are deleted when
// asked (kwokctl's defaults).
var kwokStages = []string{
	"kustomize/stage/node/fast/node-initialize.yaml",
	"kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
	"kustomize/stage/pod/fast/pod-ready.yaml",
	"kustomize/stage/pod/fast/pod-delete.yaml",
}

// InstallKwok returns kwok at KwokVersion, built from the Go module proxy
// into cacheDir ("" = DefaultCacheDir()) on first use (about 3 min on 2
// cores), and its stage files.
func InstallKwok(ctx context.Context, cacheDir string) (*Kwok, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	bin, err := GoInstall(ctx, filepath.Join(cacheDir, "kwok-"+KwokVersion), "sigs.k8s.io/kwok/cmd/kwok@"+KwokVersion, "kwok", nil, nil)
	if err != nil {
		return nil, err
	}
	out, err := gocmd(ctx, os.TempDir(), nil, "mod", "download", "-json", "sigs.k8s.io/kwok@"+KwokVersion)
	if err != nil {
		return nil, err
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return nil, fmt.Errorf("go mod download sigs.k8s.io/kwok@%s: no directory in %q: %v", KwokVersion, out, err)
	}
	k := &Kwok{Bin: bin}
	for _, s := range kwokStages {
		p := filepath.Join(mod.Dir, s)
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("kwok's stage file: %w", err)
		}
		k.Stages = append(k.Stages, p)
	}
	return k, nil
}

// StartKwokLease runs kwok in c's network namespace as the admin,
// serving the nodes annotated kwok.x-k8s.io/node=fake, their leases
// leaseSeconds long (a kubelet's are 40 s), renewed every quarter of it.
func (c *Cluster) StartKwokLease(k *Kwok, leaseSeconds int) error {
	args := []string{"--kubeconfig", c.Kubeconfig, "--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector", KwokNodeAnnotation + "=fake",
		"--node-lease-duration-seconds", strconv.Itoa(leaseSeconds), "--server-address", "127.0.0.1:10247"}
	for _, s := range k.Stages {
		args = append(args, "--config", s)
	}
	return c.Start("kwok", k.Bin, args...)
}

// KwokNodeAnnotation marks the nodes kwok serves (value "fake").
const KwokNodeAnnotation = "kwok.x-k8s.io/node"
