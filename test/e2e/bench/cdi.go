package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// The CDI specification format (cdiVersion 0.6.0), as much of it as the
// benchmark writes. containerd resolves these specs itself.
type cdiSpec struct {
	Version        string            `json:"cdiVersion"`
	Kind           string            `json:"kind"`
	Devices        []cdiDevice       `json:"devices"`
	ContainerEdits cdiEdits          `json:"containerEdits,omitempty"`
	Annotations    map[string]string `json:"annotations,omitempty"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string        `json:"env,omitempty"`
	DeviceNodes []cdiDeviceNode `json:"deviceNodes,omitempty"`
	Hooks       []cdiHook       `json:"hooks,omitempty"`
	Mounts      []cdiMount      `json:"mounts,omitempty"`
}

type cdiDeviceNode struct {
	Path        string `json:"path"`
	HostPath    string `json:"hostPath,omitempty"`
	Type        string `json:"type,omitempty"`
	Major       int64  `json:"major,omitempty"`
	Minor       int64  `json:"minor,omitempty"`
	Permissions string `json:"permissions,omitempty"`
}

type cdiHook struct {
	HookName string   `json:"hookName"`
	Path     string   `json:"path"`
	Args     []string `json:"args,omitempty"`
	Env      []string `json:"env,omitempty"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Type          string   `json:"type,omitempty"`
	Options       []string `json:"options,omitempty"`
}

// Kinds of the CDI specs the benchmark writes.
const (
	// adjustmentKind holds one device per benchmark case: exactly what
	// nri-gpu's adjustment for that case holds (path 4, containerd's own CDI
	// injection of the same files).
	adjustmentKind = "bench.nri-gpu.dev/gpu"
	// toolkitKind is the NVIDIA toolkit's kind, for a spec shaped like
	// `nvidia-ctk cdi generate` output (path 5 and 6).
	toolkitKind = "nvidia.com/gpu"
)

// adjustmentDevice turns an NRI adjustment into the CDI device that makes
// the same edits: the same device nodes (with their cgroup rules, which CDI
// adds for every device node), the same bind mounts with the same options,
// and the same environment, except NVIDIA_VISIBLE_DEVICES: the plugins read
// it as a request, so a CDI-injected value would make nri-gpu inject too.
func adjustmentDevice(name string, adj *api.ContainerAdjustment) cdiDevice {
	d := cdiDevice{Name: name}
	for _, dev := range adj.GetLinux().GetDevices() {
		d.ContainerEdits.DeviceNodes = append(d.ContainerEdits.DeviceNodes, cdiDeviceNode{
			Path: dev.Path, Type: dev.Type, Major: dev.Major, Minor: dev.Minor, Permissions: "rw",
		})
	}
	for _, m := range adj.GetMounts() {
		d.ContainerEdits.Mounts = append(d.ContainerEdits.Mounts, cdiMount{
			HostPath: m.Source, ContainerPath: m.Destination, Type: m.Type, Options: m.Options,
		})
	}
	for _, kv := range adj.GetEnv() {
		if kv.Key == "NVIDIA_VISIBLE_DEVICES" {
			continue
		}
		d.ContainerEdits.Env = append(d.ContainerEdits.Env, kv.Key+"="+kv.Value)
	}
	return d
}

// writeSpec writes a CDI spec as JSON into dir.
func writeSpec(dir, file string, s *cdiSpec) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, file), b, 0o644)
}

// toolkitMountOptions are the options nvidia-ctk gives every driver file
// mount (internal/discover/mounts.go).
var toolkitMountOptions = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}

// toolkitSpec builds a CDI spec shaped like the output of `nvidia-ctk cdi
// generate --driver-root <node>` v1.20.2 for the simulated node
// (pkg/nvcdi/driver-nvml.go, internal/discover): one device per GPU (by
// index, by UUID) and "all" with the GPU's device node; common edits with
// the control nodes, every driver file (libraries, binaries, firmware) as
// its own read-only bind mount at its host path, and the createContainer
// hooks create-symlinks, enable-cuda-compat, update-ldcache and
// disable-device-node-modification of nvidia-cdi-hook, plus
// NVIDIA_VISIBLE_DEVICES=void and the /dev/null "void" volume mount that
// keep the legacy runtime from injecting twice.
func toolkitSpec(n *simnode.Node, hook string) (*cdiSpec, error) {
	s := &cdiSpec{Version: "0.6.0", Kind: toolkitKind}
	var all cdiEdits
	for _, g := range n.GPUs {
		node := cdiDeviceNode{Path: fmt.Sprintf("/dev/nvidia%d", g.Minor), HostPath: n.HostPath(fmt.Sprintf("/dev/nvidia%d", g.Minor))}
		e := cdiEdits{DeviceNodes: []cdiDeviceNode{node}}
		s.Devices = append(s.Devices, cdiDevice{Name: fmt.Sprint(g.Index), ContainerEdits: e})
		s.Devices = append(s.Devices, cdiDevice{Name: g.UUID, ContainerEdits: e})
		all.DeviceNodes = append(all.DeviceNodes, node)
	}
	s.Devices = append(s.Devices, cdiDevice{Name: "all", ContainerEdits: all})

	ce := &s.ContainerEdits
	for _, dev := range []string{"nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"} {
		p := "/dev/" + dev
		if _, err := os.Stat(n.HostPath(p)); err == nil {
			ce.DeviceNodes = append(ce.DeviceNodes, cdiDeviceNode{Path: p, HostPath: n.HostPath(p)})
		}
	}
	var links, libDirs []string
	seenLink, seenDir := map[string]bool{}, map[string]bool{}
	addLink := func(target, link string) {
		l := target + "::" + link
		if !seenLink[l] {
			seenLink[l] = true
			links = append(links, l)
		}
	}
	for _, f := range n.Files {
		ce.Mounts = append(ce.Mounts, cdiMount{HostPath: n.HostPath(f.Path), ContainerPath: f.Path, Options: toolkitMountOptions})
		if f.SONAME == "" {
			continue
		}
		dir, base := path.Split(f.Path)
		dir = strings.TrimSuffix(dir, "/")
		if !seenDir[dir] {
			seenDir[dir] = true
			libDirs = append(libDirs, dir)
		}
		// getLinksForMount: libcuda.so -> libcuda.so.1.
		if strings.HasPrefix(base, "libcuda.so.") {
			addLink("libcuda.so.1", path.Join(dir, "libcuda.so"))
		}
		// getDotSoSymlinks: SONAME -> file and lib.so -> SONAME, when the
		// host has them.
		if f.SONAME != base && isLink(n.HostPath(path.Join(dir, f.SONAME))) {
			addLink(base, path.Join(dir, f.SONAME))
		}
		if i := strings.Index(f.SONAME, ".so"); i > 0 {
			so := f.SONAME[:i+3]
			if so != f.SONAME && isLink(n.HostPath(path.Join(dir, so))) {
				addLink(f.SONAME, path.Join(dir, so))
			}
		}
	}
	env := []string{"NVIDIA_CTK_DEBUG=false"}
	hookArgs := func(args ...string) []string { return append([]string{"nvidia-cdi-hook"}, args...) }
	if len(links) > 0 {
		var args []string
		for _, l := range links {
			args = append(args, "--link", l)
		}
		ce.Hooks = append(ce.Hooks, cdiHook{HookName: "createContainer", Path: hook, Args: hookArgs(append([]string{"create-symlinks"}, args...)...), Env: env})
	}
	ce.Hooks = append(ce.Hooks, cdiHook{HookName: "createContainer", Path: hook, Args: hookArgs("enable-cuda-compat", "--host-driver-version="+n.DriverVersion), Env: env})
	ldArgs := []string{"update-ldcache"}
	for _, d := range libDirs {
		ldArgs = append(ldArgs, "--folder", d)
	}
	ce.Hooks = append(ce.Hooks, cdiHook{HookName: "createContainer", Path: hook, Args: hookArgs(ldArgs...), Env: env})
	ce.Hooks = append(ce.Hooks, cdiHook{HookName: "createContainer", Path: hook, Args: hookArgs("disable-device-node-modification"), Env: env})
	ce.Env = append(ce.Env, "NVIDIA_CTK_LIBCUDA_DIR="+strings.Join(libDirs, ":"), "NVIDIA_VISIBLE_DEVICES=void")
	ce.Mounts = append(ce.Mounts, cdiMount{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/void", Options: []string{"ro", "nosuid", "nodev", "bind"}})
	return s, nil
}

func isLink(p string) bool {
	st, err := os.Lstat(p)
	return err == nil && st.Mode()&os.ModeSymlink != 0
}

// WriteToolkitSpec writes the CDI spec `nvidia-ctk cdi generate` makes for
// the simulated node n (toolkitSpec; hook is nvidia-cdi-hook's path) into
// dir/file, for a runtime that runs the NVIDIA toolkit's path elsewhere
// (the cluster's pod start figures).
func WriteToolkitSpec(dir, file string, n *simnode.Node, hook string) error {
	s, err := toolkitSpec(n, hook)
	if err != nil {
		return err
	}
	return writeSpec(dir, file, s)
}

// ToolkitKind is the CDI kind of WriteToolkitSpec's devices.
const ToolkitKind = toolkitKind
