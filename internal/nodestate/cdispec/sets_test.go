package cdispec_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdispec"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/libcache"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestGenerateGPUSetFiles checks that a graphics spec's device "all"
// mounts the application profile and by-path links nri-gpu prepared for
// the set of every GPU (files that exist, read-only), that no single GPU's
// device carries them, that the spec sets GBM_BACKENDS_PATH, and that it
// validates; with libraryMode: files there are none.
func TestGenerateGPUSetFiles(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: the GPUs of a simulated node are character devices made with mknod: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []config.LibraryMode{config.LibraryDirectory, config.LibraryFiles} {
		cfg := config.Default()
		cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount, cfg.LibraryMode = n.Root, n.Root, n.Root, mode
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
			t.Fatalf("%s: the spec does not validate: %v", mode, err)
		}
		for _, d := range spec.Devices[:len(spec.Devices)-1] {
			if len(d.ContainerEdits.Mounts) != 0 {
				t.Errorf("%s: device %s mounts %+v", mode, d.Name, d.ContainerEdits.Mounts)
			}
		}
		all := spec.Devices[len(spec.Devices)-1]
		got := map[string]string{}
		for _, m := range all.ContainerEdits.Mounts {
			got[m.ContainerPath] = m.HostPath
			if !slices.Contains(m.Options, "ro") {
				t.Errorf("%s: %s mounted writable: %v", mode, m.ContainerPath, m.Options)
			}
		}
		if mode == config.LibraryFiles {
			if len(got) != 0 {
				t.Errorf("libraryMode files: device all mounts %v", got)
			}
			continue
		}
		if all.Name != "all" || len(got) != 2 {
			t.Fatalf("device %s mounts %v, want the profile and by-path links", all.Name, got)
		}
		data, err := os.ReadFile(got[adjust.ProfileDestination])
		mask := uint64(1)<<uint(n.GPUs[0].Minor) | uint64(1)<<uint(n.GPUs[1].Minor)
		if err != nil || string(data) != string(libcache.ProfileContent(mask)) {
			t.Errorf("profile %s: %q, %v; want the profile of both GPUs", got[adjust.ProfileDestination], data, err)
		}
		for _, g := range n.GPUs {
			link := got[adjust.ByPathDestination] + "/pci-" + g.BusID + "-render"
			if target, err := os.Readlink(link); err != nil || !strings.HasPrefix(target, "../renderD") {
				t.Errorf("by-path %s: %q, %v", link, target, err)
			}
		}
		if !slices.Contains(spec.ContainerEdits.Env, "GBM_BACKENDS_PATH=/usr/local/nvidia/lib64/gbm") {
			t.Errorf("spec environment %q lacks GBM_BACKENDS_PATH", spec.ContainerEdits.Env)
		}
	}
}

// TestGenerateIMEX checks the spec of the IMEX channels: kind
// nvidia.com/imex-channel, one device per channel named by its number with
// its node, valid; a node without channels is an error.
func TestGenerateIMEX(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: IMEX channels are character devices made with mknod: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1, DeviceNodes: true, IMEXChannels: 2})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root
	p, err := node.New(cfg, logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cdispec.GenerateIMEX(p.State().Source)
	if err != nil {
		t.Fatal(err)
	}
	data, err := cdispec.Marshal(spec)
	if err != nil {
		t.Fatalf("the spec does not validate: %v", err)
	}
	if !strings.Contains(string(data), "kind: nvidia.com/imex-channel") || len(spec.Devices) != 2 {
		t.Fatalf("spec:\n%s", data)
	}
	for i, d := range spec.Devices {
		nodes := d.ContainerEdits.DeviceNodes
		if d.Name != strings.TrimPrefix(inventory.IMEXChannelPath(i), inventory.IMEXChannelDir+"/channel") || len(nodes) != 1 || nodes[0].Path != inventory.IMEXChannelPath(i) || nodes[0].Minor != int64(i) {
			t.Errorf("device %s: %+v", d.Name, nodes)
		}
	}

	plain, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = plain.Root, plain.Root, plain.Root
	p, err = node.New(cfg, logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cdispec.GenerateIMEX(p.State().Source); err == nil || !strings.Contains(err.Error(), "no IMEX channels") {
		t.Errorf("GenerateIMEX without channels: %v", err)
	}
}
