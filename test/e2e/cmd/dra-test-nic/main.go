// Command dra-test-nic is a DRA driver for NICs, for the cluster's
// topology test: it stands in for a NIC vendor's driver, so that a claim
// can ask for a GPU of nri-gpu's driver and a NIC of this one on the same
// PCIe root (constraints matchAttribute resource.kubernetes.io/pcieRoot).
//
// It runs in a node's namespaces and, built on the Kubernetes helper
// library k8s.io/dynamic-resource-allocation (kubeletplugin and, through
// it, resourceslice), as a NIC driver would be:
//
//   - publishes one pool named after the node with a device nic-<i> per
//     PCI bus id it is given, whose attributes are the standard ones a
//     NIC driver reads from sysfs with the library's deviceattribute
//     helpers, as nri-gpu reads its GPUs': resource.kubernetes.io/pciBusID,
//     pcieRoot and (where sysfs has one) numaNode, and its own type "nic";
//   - prepares a claim's NICs as one trivial CDI device each, whose only
//     edit is an environment entry DRA_TEST_NIC_<i>=<bus id>: a container
//     of the claim says which NIC it was given. No device node, no mount.
//
// Usage: dra-test-nic -node NAME -kubeconfig FILE -sysfs DIR -nic BUS[,BUS...]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// DriverName is the driver's name: its ResourceSlices' driver and its
// CDI vendor's prefix.
const DriverName = "nic.e2e.nri-gpu.dev"

// cdiKind is the kind of its claims' CDI devices.
const cdiKind = "k8s." + DriverName + "/claim"

// nic is one NIC the driver publishes.
type nic struct {
	name, bus string
	attrs     map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

// driver is the NIC driver's kubelet plugin.
type driver struct {
	node, cdiDir string
	nics         map[string]nic // by device name
	order        []string
	mu           sync.Mutex
}

func main() {
	node := flag.String("node", "", "the node's name (the pool's)")
	kubeconfig := flag.String("kubeconfig", "", "the API server's kubeconfig")
	sysfs := flag.String("sysfs", "/sys", "the node's sysfs, where the NICs' PCIe roots and NUMA nodes are read")
	nics := flag.String("nic", "", "the NICs' PCI bus ids, comma-separated")
	pluginDir := flag.String("plugin-dir", "/var/lib/kubelet/plugins/"+DriverName, "the plugin's directory (the kubelet's DRA socket)")
	registrarDir := flag.String("registrar-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration directory")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "the runtime's CDI spec directory")
	flag.Parse()
	if err := run(*node, *kubeconfig, *sysfs, *nics, *pluginDir, *registrarDir, *cdiDir); err != nil {
		fmt.Fprintln(os.Stderr, "dra-test-nic:", err)
		os.Exit(1)
	}
}

func run(node, kubeconfig, sysfs, nics, pluginDir, registrarDir, cdiDir string) error {
	if node == "" || nics == "" {
		return errors.New("-node and -nic are required")
	}
	d, err := newDriver(node, sysfs, strings.Split(nics, ","), cdiDir)
	if err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	for _, dir := range []string{pluginDir, registrarDir, cdiDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registrarDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, d.resources()); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	for _, name := range d.order {
		fmt.Printf("serving %s on node %s: %s %v\n", DriverName, node, name, describe(d.nics[name].attrs))
	}
	<-ctx.Done()
	return nil
}

// newDriver reads each NIC's standard attributes from sysfs with the
// library's helpers; a NIC whose PCIe root sysfs does not tell is an
// error (the driver would publish nothing to align on).
func newDriver(node, sysfs string, buses []string, cdiDir string) (*driver, error) {
	d := &driver{node: node, cdiDir: cdiDir, nics: map[string]nic{}}
	fs := deviceattribute.WithFSFromRoot(sysfs)
	for i, bus := range buses {
		bus = strings.ToLower(strings.TrimSpace(bus))
		n := nic{name: fmt.Sprintf("nic-%d", i), bus: bus, attrs: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
		typ := "nic"
		n.attrs["type"] = resourceapi.DeviceAttribute{StringValue: &typ}
		id, err := deviceattribute.GetPCIBusIDAttribute(bus)
		if err != nil {
			return nil, err
		}
		n.attrs[id.Name] = id.Value
		root, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bus, fs)
		if err != nil {
			return nil, err
		}
		n.attrs[root.Name] = root.Value
		if numa, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(bus, deviceattribute.ScalarAttribute, fs); err == nil {
			n.attrs[numa.Name] = numa.Value
		}
		d.nics[n.name] = n
		d.order = append(d.order, n.name)
	}
	return d, nil
}

// describe is a NIC's attributes for the log.
func describe(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		switch {
		case v.StringValue != nil:
			out[string(k)] = *v.StringValue
		case v.IntValue != nil:
			out[string(k)] = fmt.Sprint(*v.IntValue)
		}
	}
	return out
}

// resources is the node's pool: its NICs.
func (d *driver) resources() resourceslice.DriverResources {
	var devs []resourceapi.Device
	for _, name := range d.order {
		devs = append(devs, resourceapi.Device{Name: name, Attributes: d.nics[name].attrs})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{d.node: {Slices: []resourceslice.Slice{{Devices: devs}}}}}
}

// specPath is the claim's CDI spec.
func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("k8s.%s-claim_%s.json", DriverName, uid))
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin: each NIC of
// a claim is a CDI device with an environment entry naming its bus id.
func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		out[c.UID] = d.prepare(c)
	}
	return out, nil
}

// cdiSpec is the little of a CDI spec the driver writes.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string `json:"name"`
	ContainerEdits struct {
		Env []string `json:"env"`
	} `json:"containerEdits"`
}

func (d *driver) prepare(c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if c.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: not allocated", c.Namespace, c.Name)}
	}
	spec := cdiSpec{Version: "0.6.0", Kind: cdiKind}
	var res kubeletplugin.PrepareResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		n, ok := d.nics[r.Device]
		if !ok || r.Pool != d.node {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: device %s/%s is not a NIC of node %s", c.Namespace, c.Name, r.Pool, r.Device, d.node)}
		}
		dev := cdiDevice{Name: fmt.Sprintf("%s-%s", c.UID, n.name)}
		dev.ContainerEdits.Env = []string{fmt.Sprintf("DRA_TEST_NIC_%s=%s", strings.TrimPrefix(n.name, "nic-"), n.bus)}
		spec.Devices = append(spec.Devices, dev)
		res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{cdiKind + "=" + dev.Name}})
	}
	data, err := json.Marshal(spec)
	if err == nil {
		tmp := d.specPath(c.UID) + ".tmp"
		if err = os.WriteFile(tmp, data, 0o644); err == nil {
			err = os.Rename(tmp, d.specPath(c.UID))
		}
	}
	if err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
	}
	return res
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: the
// claims' specs go.
func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		out[c.UID] = err
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin.
func (d *driver) HandleError(_ context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "dra-test-nic: %s: %v\n", msg, err)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: no health.
func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
