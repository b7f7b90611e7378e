package cdispec_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdispec"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

func TestGenerate(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: checks the spec's devices, the GPUs found through /dev/nvidia* character devices, made with mknod: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2, SwapMinors: true, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"files", "directory"} {
		t.Run(mode, func(t *testing.T) {
			cfg := config.Default()
			cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount, cfg.LibraryMode = n.Root, n.Root, n.Root, config.LibraryMode(mode)
			cfg.Layout, cfg.BinaryDir = config.LayoutToolkit, "" // as nri-gpu cdi generate does
			log := logrus.New()
			log.SetOutput(os.Stderr)
			p, err := node.New(cfg, log)
			if err != nil {
				t.Fatal(err)
			}
			spec, err := cdispec.Generate(p.State().Source, inventory.Capabilities(inventory.Utility))
			if err != nil {
				t.Fatal(err)
			}
			data, err := cdispec.Marshal(spec)
			if err != nil {
				t.Fatalf("the spec does not validate: %v", err)
			}
			var names []string
			for _, d := range spec.Devices {
				names = append(names, d.Name)
			}
			want := []string{"0", n.GPUs[0].UUID, "1", n.GPUs[1].UUID, "all"}
			if !slices.Equal(names, want) {
				t.Errorf("devices %q, want %q", names, want)
			}
			if d := spec.Devices[0].ContainerEdits.DeviceNodes; len(d) != 1 || d[0].Minor != int64(n.GPUs[0].Minor) {
				t.Errorf("device 0 nodes %+v, want minor %d", d, n.GPUs[0].Minor)
			}
			// utility only: no uvm nodes, no libcuda, nvidia-smi present.
			s := string(data)
			if strings.Contains(s, "nvidia-uvm") || strings.Contains(s, "libcuda") || !strings.Contains(s, "/usr/bin/nvidia-smi") {
				t.Errorf("utility-only spec has the wrong files:\n%s", s)
			}
			if mode == "directory" && !strings.Contains(s, "containerPath: /usr/local/nvidia/lib64\n") {
				t.Errorf("directory mode spec lacks the library directory mount:\n%s", s)
			}
			if !strings.Contains(s, "kind: nvidia.com/gpu") {
				t.Errorf("kind missing:\n%s", s)
			}
		})
	}
}

// TestGenerateBinaryDir checks that the nvidia layout's binaryDir, which
// needs PATH appended and CDI cannot say so, is a clear error, not a spec that replaces the
// image's PATH or lacks the binaries. The node has no device nodes (so no
// GPU): no root needed.
func TestGenerateBinaryDir(t *testing.T) {
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root // layout nvidia, binaryDir /usr/local/nvidia/bin
	p, err := node.New(cfg, logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cdispec.Generate(p.State().Source, inventory.DefaultCapabilities); err == nil || !strings.Contains(err.Error(), "layout nvidia (binaries in binaryDir /usr/local/nvidia/bin, appended to PATH) cannot be expressed in a CDI spec") {
		t.Errorf("Generate with binaryDir: %v", err)
	}
}

// TestGenerateGraphicsAndIPC checks that a spec of graphics and utility
// gives each GPU device its DRM nodes with the host group, the vendor
// files, and the IPC sockets with their own mount options (writable,
// noexec), as an nri-gpu request of those capabilities gets them; and
// that a compute-only spec has no DRM node.
func TestGenerateGraphicsAndIPC(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: the GPUs of a simulated node are character devices made with mknod: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2, DeviceNodes: true, IPC: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount, cfg.LibraryMode = n.Root, n.Root, n.Root, config.LibraryFiles
	cfg.Layout, cfg.BinaryDir = config.LayoutToolkit, "" // as nri-gpu cdi generate does
	p, err := node.New(cfg, logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cdispec.Generate(p.State().Source, inventory.Capabilities(inventory.Graphics|inventory.Utility))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cdispec.Marshal(spec); err != nil {
		t.Fatalf("the spec does not validate: %v", err)
	}
	d := spec.Devices[2].ContainerEdits.DeviceNodes // device "1"
	if len(d) != 3 || d[1].Path != simnode.CardPath(1) || d[2].Path != simnode.RenderPath(1) || d[2].GID == nil || *d[2].GID != simnode.RenderGID {
		t.Errorf("device 1 nodes %+v, want its nvidia, card and render nodes with gid %d", d, simnode.RenderGID)
	}
	found := map[string]string{}
	for _, m := range spec.ContainerEdits.Mounts {
		found[m.ContainerPath] = strings.Join(m.Options, ",")
	}
	if found[simnode.PersistencedSocket] != "nosuid,nodev,rbind,rprivate,noexec" || found["/usr/share/glvnd/egl_vendor.d/10_nvidia.json"] != "ro,nosuid,nodev,rbind,rprivate" {
		t.Errorf("mounts %v", found)
	}

	spec, err = cdispec.Generate(p.State().Source, inventory.Capabilities(inventory.Compute))
	if err != nil {
		t.Fatal(err)
	}
	if d := spec.Devices[2].ContainerEdits.DeviceNodes; len(d) != 1 {
		t.Errorf("compute spec device 1 nodes %+v, want its nvidia node only", d)
	}
}
