// Command nvidia-dra-standin is a stand-in for the kubelet plugin of
// NVIDIA's DRA driver for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu,
// cmd/gpu-kubelet-plugin), for the cluster's pod start figures: it
// delivers a claim's GPUs the way that driver does, so that pod start
// through it can be set against pod start through nri-gpu's driver on the
// same control plane, kubelet and runtime.
//
// It runs in a node's namespaces (the kubelet's plugin directories, the
// node's CDI directory, the API server) and, built on the Kubernetes
// helper library k8s.io/dynamic-resource-allocation/kubeletplugin as
// NVIDIA's driver is:
//
//   - publishes one pool named after the node with the node's GPUs as
//     gpu-<minor>, with NVIDIA's attributes (type, uuid, productName,
//     index, minor, resource.kubernetes.io/pciBusID) and memory capacity;
//   - on PrepareResourceClaims writes, for each claim, a transient CDI
//     spec as NVIDIA's CDIHandler.CreateClaimSpecFile does: file
//     k8s.gpu.nvidia.com-claim_<claim UID>.yaml in the CDI directory,
//     kind k8s.gpu.nvidia.com/claim, one device <claim UID>-gpu-<minor>
//     per allocated GPU holding that GPU's edits, and as the spec's common
//     edits the toolkit's common edits (driver files as bind mounts, the
//     control device nodes, NVIDIA_VISIBLE_DEVICES=void and the
//     nvidia-cdi-hook createContainer hooks create-symlinks,
//     enable-cuda-compat, update-ldcache, disable-device-node-modification);
//     both are taken from the node's toolkit spec (what `nvidia-ctk cdi
//     generate` writes, test/e2e/bench.WriteToolkitSpec), where NVIDIA's
//     driver gets them from the same library (nvcdi's GetCommonEdits and
//     GetDeviceSpecsByID); it returns the CDI device IDs
//     k8s.gpu.nvidia.com/claim=<claim UID>-gpu-<minor>;
//   - keeps its claims in a checkpoint in the plugin directory, written as
//     NVIDIA's driver writes its own (device_state.go: updateCheckpoint,
//     through the kubelet's checkpoint manager: a temporary file, fsync,
//     rename): twice per prepare (PrepareStarted before the spec,
//     PrepareCompleted after), once per unprepare;
//   - on UnprepareResourceClaims removes the claim's spec.
//
// What it leaves out of NVIDIA's driver: NVML (the GPUs come from the
// configuration), MIG, sharing (MPS, time-slicing) and device configs,
// health.
//
// Usage: nvidia-dra-standin CONFIG, CONFIG being a JSON file of type
// config.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/test/e2e/cmd/nvidia-dra-standin/standin"
)

// NVIDIA's driver's CDI vendor and class for claims (cdi.go: cdiVendor,
// cdiClaimClass).
const (
	cdiVendor = "k8s.gpu.nvidia.com"
	cdiClass  = "claim"
)

// config is the stand-in's configuration file; gpu one GPU of the node.
type (
	config = standin.Config
	gpu    = standin.GPU
)

// cdiSpec is a CDI spec, its edits kept as they were read.
type cdiSpec struct {
	Version        string          `json:"cdiVersion"`
	Kind           string          `json:"kind"`
	Devices        []cdiDevice     `json:"devices"`
	ContainerEdits json.RawMessage `json:"containerEdits,omitempty"`
}

type cdiDevice struct {
	Name           string          `json:"name"`
	ContainerEdits json.RawMessage `json:"containerEdits"`
}

// driver is the stand-in's DRA plugin.
type driver struct {
	cfg     config
	toolkit cdiSpec
	gpus    map[string]gpu // by device name
	mu      sync.Mutex
	// ckpt is the checkpoint's content: claim UID -> state; mu guards it.
	ckpt map[types.UID]string
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: nvidia-dra-standin CONFIG")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "nvidia-dra-standin:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	d := &driver{gpus: map[string]gpu{}, ckpt: map[types.UID]string{}}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &d.cfg); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	raw, err = os.ReadFile(d.cfg.ToolkitSpec)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &d.toolkit); err != nil {
		return fmt.Errorf("read the toolkit spec %s: %w", d.cfg.ToolkitSpec, err)
	}
	for _, g := range d.cfg.GPUs {
		d.gpus[g.DeviceName()] = g
	}
	rc, err := clientcmd.BuildConfigFromFlags("", d.cfg.Kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	for _, dir := range []string{d.cfg.PluginDir, d.cfg.RegistrarDir, d.cfg.CDIDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(d.cfg.DriverName),
		kubeletplugin.NodeName(d.cfg.NodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(d.cfg.PluginDir),
		kubeletplugin.RegistrarDirectoryPath(d.cfg.RegistrarDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, d.resources()); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	fmt.Printf("serving driver %s on node %s with %d GPUs\n", d.cfg.DriverName, d.cfg.NodeName, len(d.cfg.GPUs))
	<-ctx.Done()
	return nil
}

// resources is the node's pool: its GPUs, with NVIDIA's attributes.
func (d *driver) resources() resourceslice.DriverResources {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	num := func(i int) resourceapi.DeviceAttribute {
		v := int64(i)
		return resourceapi.DeviceAttribute{IntValue: &v}
	}
	var devs []resourceapi.Device
	for _, g := range d.cfg.GPUs {
		devs = append(devs, resourceapi.Device{
			Name: g.DeviceName(),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": str("gpu"), "uuid": str(g.UUID), "productName": str(g.ProductName),
				"index": num(g.Index), "minor": num(g.Minor), "resource.kubernetes.io/pciBusID": str(g.PCIBusID),
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: *resource.NewQuantity(g.MemoryMiB<<20, resource.BinarySI)},
			},
		})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}
}

// specPath is the claim's transient spec, named as the CDI library's
// GenerateTransientSpecName does: <vendor>-<class>_<claim UID>.yaml.
func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cfg.CDIDir, fmt.Sprintf("%s-%s_%s.yaml", cdiVendor, cdiClass, uid))
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		out[c.UID] = d.prepare(c)
	}
	return out, nil
}

func (d *driver) prepare(c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if c.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: not allocated", c.Namespace, c.Name)}
	}
	spec := cdiSpec{Version: d.toolkit.Version, Kind: cdiVendor + "/" + cdiClass, ContainerEdits: d.toolkit.ContainerEdits}
	var res kubeletplugin.PrepareResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		g, ok := d.gpus[r.Device]
		if !ok {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: device %q is not a GPU of node %s", c.Namespace, c.Name, r.Device, d.cfg.NodeName)}
		}
		edits, ok := d.toolkitEdits(g.UUID)
		if !ok {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: the toolkit spec has no device %s", c.Namespace, c.Name, g.UUID)}
		}
		name := fmt.Sprintf("%s-%s", c.UID, g.DeviceName())
		spec.Devices = append(spec.Devices, cdiDevice{Name: name, ContainerEdits: edits})
		res.Devices = append(res.Devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{cdiVendor + "/" + cdiClass + "=" + name},
		})
	}
	for _, step := range []func() error{
		func() error { return d.checkpoint(c.UID, "PrepareStarted") },
		func() error { return writeSpec(d.specPath(c.UID), spec) },
		func() error { return d.checkpoint(c.UID, "PrepareCompleted") },
	} {
		if err := step(); err != nil {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
		}
	}
	return res
}

// checkpoint sets the claim uid's state ("" removes it) and writes the
// checkpoint as the kubelet's checkpoint manager does: a temporary file
// in the directory, fsync, rename. The caller holds mu.
func (d *driver) checkpoint(uid types.UID, state string) error {
	if state == "" {
		delete(d.ckpt, uid)
	} else {
		d.ckpt[uid] = state
	}
	data, err := json.Marshal(d.ckpt)
	if err != nil {
		return err
	}
	path := filepath.Join(d.cfg.PluginDir, "checkpoint.json")
	f, err := os.CreateTemp(d.cfg.PluginDir, ".checkpoint")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// toolkitEdits are the edits of the toolkit spec's device uuid.
func (d *driver) toolkitEdits(uuid string) (json.RawMessage, bool) {
	for _, dev := range d.toolkit.Devices {
		if dev.Name == uuid {
			return dev.ContainerEdits, true
		}
	}
	return nil, false
}

// writeSpec writes s as YAML to path, through a temporary file renamed
// over it, so that the runtime never reads half a spec.
func writeSpec(path string, s cdiSpec) error {
	j, err := json.Marshal(s)
	if err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, y, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: the claims'
// specs go.
func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err == nil {
			err = d.checkpoint(c.UID, "")
		}
		out[c.UID] = err
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin.
func (d *driver) HandleError(_ context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "nvidia-dra-standin: %s: %v\n", msg, err)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: no health.
func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
