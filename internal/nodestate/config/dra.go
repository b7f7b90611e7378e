package config

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// DRA configures nri-gpu's Dynamic Resource Allocation kubelet plugin,
// which publishes the node's GPUs and MIG devices as ResourceSlices and
// prepares the ResourceClaims the scheduler allocated from them.
type DRA struct {
	// Enabled starts the DRA kubelet plugin with nri-gpu run.
	Enabled bool `json:"enabled,omitempty"`
	// DriverName is the DRA driver's name: the ResourceSlices' driver,
	// the DeviceClasses' device.driver.
	DriverName string `json:"driverName,omitempty"`
	// PluginDir is the plugin's own directory, where it serves the
	// kubelet's DRA socket (dra.sock) and keeps its checkpoint; the same
	// path on the host and in nri-gpu's container.
	PluginDir string `json:"pluginDir,omitempty"`
	// RegistrationDir is the kubelet's plugin registration directory.
	RegistrationDir string `json:"registrationDir,omitempty"`
	// CDIDir is the runtime's CDI spec directory where the specs of
	// prepared claims are written (one per claim), as nri-gpu sees it.
	CDIDir string `json:"cdiDir,omitempty"`
	// Kubeconfig is a kubeconfig file to reach the API server with; empty
	// uses the pod's service account (in-cluster).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Devices are the GPUs DRA publishes (indexes, GPU UUIDs or PCI bus
	// ids; a GPU brings its MIG devices); empty: all of the node's GPUs.
	Devices []string `json:"devices,omitempty"`
	// MemoryShares publishes GPUs as shareable by memory through DRA's
	// consumable capacity (off by default; see DRAMemoryShares).
	MemoryShares DRAMemoryShares `json:"memoryShares,omitempty"`
	// DynamicMIG makes MIG devices on demand (partitionable devices; see
	// DRADynamicMIG).
	DynamicMIG DRADynamicMIG `json:"dynamicMIG,omitempty"`
}

// Defaults of the dra key.
const (
	DefaultDRADriverName      = "gpu.nri-gpu.dev"
	DefaultDRAPluginsDir      = "/var/lib/kubelet/plugins"
	DefaultDRARegistrationDir = "/var/lib/kubelet/plugins_registry"
	DefaultDRACDIDir          = "/var/run/cdi"
)

func (d *DRA) setDefaults() {
	if d.DriverName == "" {
		d.DriverName = DefaultDRADriverName
	}
	if d.PluginDir == "" {
		d.PluginDir = filepath.Join(DefaultDRAPluginsDir, d.DriverName)
	}
	if d.RegistrationDir == "" {
		d.RegistrationDir = DefaultDRARegistrationDir
	}
	if d.CDIDir == "" {
		d.CDIDir = DefaultDRACDIDir
	}
	d.MemoryShares.setDefaults()
}

// validate checks the dra key's names and paths.
func (d DRA) validate() error {
	if why := dnsSubdomainProblem(d.DriverName); why != "" {
		return fmt.Errorf("key dra.driverName: %q is not a DNS subdomain such as %s: %s", d.DriverName, DefaultDRADriverName, why)
	}
	for key, p := range map[string]string{"dra.pluginDir": d.PluginDir, "dra.registrationDir": d.RegistrationDir, "dra.cdiDir": d.CDIDir} {
		if err := checkPath(key, p); err != nil {
			return err
		}
	}
	if d.Kubeconfig != "" {
		if err := checkPath("dra.kubeconfig", d.Kubeconfig); err != nil {
			return err
		}
	}
	// The kubelet's DRA socket, <pluginDir>/dra.sock, and the
	// registration socket <registrationDir>/<driverName>-reg.sock must fit
	// in a unix socket address (108 bytes with its NUL).
	if l := len(d.PluginDir) + len("/dra.sock"); l > 107 {
		return fmt.Errorf("key dra.pluginDir: %q: the DRA socket's path would be %d bytes, more than a unix socket allows (107)", d.PluginDir, l)
	}
	if l := len(d.RegistrationDir) + len("/") + len(d.DriverName) + len("-reg.sock"); l > 107 {
		return fmt.Errorf("key dra.registrationDir: %q: the registration socket's path would be %d bytes, more than a unix socket allows (107)", d.RegistrationDir, l)
	}
	if err := checkDeviceList("dra.devices", d.Devices); err != nil {
		return err
	}
	if d.MemoryShares.Enabled() && !d.Enabled {
		return fmt.Errorf("key dra.memoryShares.devices: set without dra.enabled: GPUs are shared by memory through nri-gpu's DRA driver only (set dra.enabled: true, or remove dra.memoryShares)")
	}
	if err := d.DynamicMIG.validate(d); err != nil {
		return err
	}
	return d.MemoryShares.validate()
}

// checkDeviceList checks the entries of a devices key: a GPU index, a GPU
// UUID or a PCI bus id each, none twice.
func checkDeviceList(key string, list []string) error {
	seen := map[string]bool{}
	for _, e := range list {
		k, err := deviceKey(e)
		if err != nil {
			return fmt.Errorf("key %s: %w", key, err)
		}
		if seen[k] {
			return fmt.Errorf("key %s: %q is listed twice", key, e)
		}
		seen[k] = true
	}
	return nil
}

// deviceKey returns a devices entry in one form per GPU it names: a
// decimal index, an upper-case UUID, or a bus id in /proc's form.
func deviceKey(e string) (string, error) {
	switch {
	case e == "":
		return "", fmt.Errorf("empty entry (valid: a GPU index such as 0, a GPU UUID such as GPU-<uuid>, a PCI bus id such as 0000:38:00.0)")
	case strings.HasPrefix(strings.ToUpper(e), "GPU-"):
		return strings.ToUpper(e), nil
	case strings.Contains(e, ":"):
		b, err := inventory.NormalizeBusID(e)
		if err != nil {
			return "", fmt.Errorf("%q: %v (valid: a GPU index, a GPU UUID, a PCI bus id such as 0000:38:00.0)", e, err)
		}
		return b, nil
	}
	n, err := strconv.Atoi(e)
	if err != nil || n < 0 || n >= inventory.MIGKeyBase || strconv.Itoa(n) != e {
		return "", fmt.Errorf("%q is not a GPU (valid: a GPU index such as 0, a GPU UUID such as GPU-<uuid>, a PCI bus id such as 0000:38:00.0)", e)
	}
	return e, nil
}

// DeviceList is a validated devices key: the GPUs one allocator (the
// device plugin or DRA) offers. Nil offers every GPU.
type DeviceList []string

// Matches reports whether the list names GPU g or, for a MIG device, its
// parent GPU (a MIG device goes with its GPU).
func (l DeviceList) Matches(g inventory.GPU, parent inventory.GPU) bool {
	if l == nil {
		return true
	}
	if g.MIG != nil {
		g = parent
	}
	for _, e := range l {
		k, err := deviceKey(e)
		if err != nil {
			continue
		}
		if k == strconv.Itoa(g.Index) || k == strings.ToUpper(g.UUID) || k == g.BusID {
			return true
		}
	}
	return false
}

// checkOneAllocator refuses a configuration that offers a GPU to the
// device plugin and to DRA both: the scheduler would count it twice.
func (c Config) checkOneAllocator() error {
	if !c.DRA.Enabled || !c.DevicePlugin.Enabled {
		return nil
	}
	if len(c.DRA.Devices) == 0 || len(c.DevicePlugin.Devices) == 0 {
		return fmt.Errorf("keys dra.enabled and devicePlugin.enabled are both true, and %s offers every GPU: a GPU is offered by one allocator only; list each one's GPUs, disjoint, in dra.devices and devicePlugin.devices, or turn one off", emptyOf(c))
	}
	dp := map[string]string{}
	for _, e := range c.DevicePlugin.Devices {
		k, _ := deviceKey(e)
		dp[k] = e
	}
	for _, e := range c.DRA.Devices {
		k, _ := deviceKey(e)
		if d, ok := dp[k]; ok {
			return fmt.Errorf("keys dra.devices and devicePlugin.devices both list %q (dra.devices) = %q (devicePlugin.devices): a GPU is offered by one allocator only", e, d)
		}
	}
	return nil
}

func emptyOf(c Config) string {
	var keys []string
	if len(c.DRA.Devices) == 0 {
		keys = append(keys, "dra.devices")
	}
	if len(c.DevicePlugin.Devices) == 0 {
		keys = append(keys, "devicePlugin.devices")
	}
	return strings.Join(keys, " and ") + " (empty)"
}

// OverlapOn checks, against the GPUs of a node, that no GPU is offered
// to the device plugin and to DRA both, when both are on: a GPU named by
// its index in one list and by its UUID or bus id in the other is found
// only here. The error names both keys and the GPU.
func (c Config) OverlapOn(gpus []inventory.GPU) error {
	if !c.DRA.Enabled || !c.DevicePlugin.Enabled {
		return nil
	}
	dra, dp := DeviceList(c.DRA.Devices), DeviceList(c.DevicePlugin.Devices)
	for _, g := range gpus {
		if g.MIG == nil && dra.Matches(g, g) && dp.Matches(g, g) {
			return fmt.Errorf("keys dra.devices and devicePlugin.devices both name GPU %d (%s, %s): a GPU is offered by one allocator only", g.Index, g.UUID, g.BusID)
		}
	}
	return nil
}

// dnsSubdomainProblem says why name is not a lower-case DNS subdomain
// ("" if it is), as a DRA driver name must be.
func dnsSubdomainProblem(name string) string {
	if name == "" || len(name) > 253 {
		return "it must be 1 to 253 characters"
	}
	if !strings.Contains(name, ".") {
		return "it must contain a domain, such as example.com"
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || !alnum(label[0], false) || !alnum(label[len(label)-1], false) ||
			slices.ContainsFunc([]byte(label), func(c byte) bool { return !alnum(c, false) && c != '-' }) {
			return fmt.Sprintf("the label %q is not lower-case letters, digits and '-', beginning and ending with a letter or digit", label)
		}
	}
	return ""
}
