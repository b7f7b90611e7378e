package dra

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/socket"
)

// TestServeOverlap: two nri-gpu pods of one node alive at once (an
// uninstall and an install overlapping): the newer replaces both
// sockets, and the older one's exit leaves them, so the kubelet keeps
// reaching the newer one. Before package socket the older one's exit
// unlinked them (the helper's listeners remove their paths on close) and
// the node's claims waited in ContainerCreating until nri-gpu restarted.
func TestServeOverlap(t *testing.T) {
	older := newEnv(t, draConfig(), testSnapshot(), nil)
	reg := filepath.Join(older.dirs.RegistrationDir, testDriver+"-reg.sock")
	plugin := filepath.Join(older.dirs.PluginDir, "dra.sock")
	olderFiles := statAll(t, reg, plugin)
	newer := newEnv(t, draConfig(), testSnapshot(), &older.dirs)
	deadline := time.Now().Add(10 * time.Second)
	var newerFiles []os.FileInfo
	for {
		fis, err := statEach(reg, plugin)
		if err == nil && !socket.Same(fis[0], olderFiles[0]) && !socket.Same(fis[1], olderFiles[1]) {
			newerFiles = fis
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the newer instance did not replace %s and %s", reg, plugin)
		}
		time.Sleep(10 * time.Millisecond)
	}
	older.stop()
	now, err := statEach(reg, plugin)
	if err != nil {
		t.Fatalf("after the older instance stopped: %v (it removed the newer one's socket)", err)
	}
	for i, p := range []string{reg, plugin} {
		if !socket.Same(now[i], newerFiles[i]) {
			t.Errorf("%s is no longer the newer instance's socket", p)
		}
	}
	cc, err := grpc.NewClient("unix://"+reg, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(cc).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil || info.Name != testDriver {
		t.Fatalf("registration after the older instance stopped: %+v, %v; want the newer one's %s", info, err, testDriver)
	}
	if _, err := newer.conn.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
		t.Errorf("the DRA service after the older instance stopped: %v", err)
	}
	newer.stop()
	for _, p := range []string{reg, plugin} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("after the newer instance stopped, %s: %v; want it removed", p, err)
		}
	}
}

// statEach stats each path, failing on the first that cannot be.
func statEach(paths ...string) ([]os.FileInfo, error) {
	var out []os.FileInfo
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

func statAll(t *testing.T, paths ...string) []os.FileInfo {
	t.Helper()
	fis, err := statEach(paths...)
	if err != nil {
		t.Fatal(err)
	}
	return fis
}
