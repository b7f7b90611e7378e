// Package config holds nri-gpu's configuration file: its keys, defaults and
// validation. Decoding is strict at every depth (an unknown, repeated or
// wrongly cased key is an error naming it), and each mode key is a typed
// value, checked once here.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Config is the plugin's configuration (YAML). Every key is documented in
// docs/configuration.md.
type Config struct {
	// HostRoot is the prefix under which the host's /proc, /sys and /dev
	// are read.
	HostRoot string `json:"hostRoot,omitempty"`
	// DriverRoot is the root of the driver's user-space files as the
	// runtime sees it; mount sources are paths under it.
	DriverRoot string `json:"driverRoot,omitempty"`
	// DriverRootMount is where nri-gpu itself reads DriverRoot, when its
	// view differs from the runtime's (a DaemonSet with the host's / at
	// /host sets driverRoot: / and driverRootMount: /host).
	DriverRootMount string `json:"driverRootMount,omitempty"`
	// LibraryDir is the container directory where driver libraries appear
	// under their SONAMEs; it is appended to the container's
	// LD_LIBRARY_PATH.
	LibraryDir string `json:"libraryDir,omitempty"`
	// Library32Dir is the same for the 32-bit libraries of compat32.
	Library32Dir string `json:"library32Dir,omitempty"`
	// LibraryMode says how libraries reach a container: "directory" (one
	// bind mount of a directory of hard links prepared in LibraryCache),
	// "files" (one bind mount per library), or "auto" (directory when the
	// cache can be made, else files with a warning).
	LibraryMode LibraryMode `json:"libraryMode,omitempty"`
	// LibraryCache is the directory, inside the driver root, where the
	// library directories are prepared: the runtime mounts them from
	// driverRoot + libraryCache. It must be a directory only nri-gpu uses.
	LibraryCache string `json:"libraryCache,omitempty"`
	// LibraryCacheMount is where nri-gpu itself reads and writes that
	// directory, when not at driverRootMount + libraryCache: a DaemonSet
	// that mounts the driver root read-only mounts the host's cache
	// directory read-write here.
	LibraryCacheMount string `json:"libraryCacheMount,omitempty"`
	// Layout says where the driver's binaries appear in a container:
	// "nvidia" (the default: in BinaryDir, /usr/local/nvidia/bin, next to
	// the libraries in /usr/local/nvidia/lib64 and lib, with BinaryDir
	// appended to PATH) or "toolkit" (each binary at /usr/bin/<name>, as
	// the NVIDIA Container Toolkit mounts them, for images that run
	// /usr/bin/nvidia-smi by absolute path). With emit: cdi the default
	// is "toolkit": a CDI spec can only replace PATH, not append to it.
	Layout Layout `json:"layout,omitempty"`
	// BinaryDir is the container directory where the driver's binaries
	// appear with layout nvidia (through one mount of a prepared
	// directory, like the libraries), appended to the container's PATH.
	// Empty with layout toolkit.
	BinaryDir string `json:"binaryDir,omitempty"`
	// Firmware says when the driver's GSP firmware directory is mounted
	// into containers: "auto" (only where the kernel would read it from
	// the container's mount namespace: Linux before 5.7, or a kernel
	// release that cannot be read), "mount" (always) or "skip" (never).
	Firmware Firmware `json:"firmware,omitempty"`
	// Emit says how GPUs are handed to the runtime: "edits" (device
	// nodes, mounts and env in the adjustment; every runtime) or "cdi"
	// (CDI device references the runtime resolves, when it can).
	Emit Emit `json:"emit,omitempty"`
	// CDISpecDirs are the runtime's CDI spec directories, read under
	// hostRoot, for emit: cdi.
	CDISpecDirs []string `json:"cdiSpecDirs,omitempty"`
	// Sharing is the node's policy for requests that do not say
	// exclusive=: "shared" (GPUs may have several holders) or "exclusive"
	// (a GPU has one holder).
	Sharing Sharing `json:"sharing,omitempty"`
	// CDIImport, when set, makes the node's devices those of another
	// vendor's CDI specs instead of NVIDIA GPUs found by discovery.
	CDIImport *CDIImport `json:"cdiImport,omitempty"`
	// Policy says which namespaces may use which request source.
	Policy policy.Policy `json:"policy,omitempty"`
	// DevicePlugin is the kubelet device plugin (off by default).
	DevicePlugin DevicePlugin `json:"devicePlugin,omitempty"`
	// DevCharLinks keeps /dev/char links for the injected device nodes
	// (on by default).
	DevCharLinks DevCharLinks `json:"devCharLinks,omitempty"`
	// Health is the XID health of GPUs and MIG devices (with NVML).
	Health Health `json:"health,omitempty"`
	// DRA is the Dynamic Resource Allocation kubelet plugin (off by
	// default).
	DRA DRA `json:"dra,omitempty"`
	// Events are the Kubernetes Events on pods whose requests were
	// refused or voided (on by default, where the API server is
	// reachable).
	Events Events `json:"events,omitempty"`
}

// DevicePlugin configures nri-gpu's kubelet device plugin, which
// advertises the node's GPUs to the kubelet as an extended resource.
type DevicePlugin struct {
	// Enabled starts the device plugin with nri-gpu run.
	Enabled bool `json:"enabled,omitempty"`
	// ResourceName is the extended resource the GPUs are advertised as.
	ResourceName string `json:"resourceName,omitempty"`
	// SocketDir is the kubelet's device plugin directory, where its
	// registration socket is and the plugin serves its own.
	SocketDir string `json:"socketDir,omitempty"`
	// DevRoot is the host's device directory as the kubelet and the
	// runtime see it: Allocate's device specs name each GPU's node there
	// on the host (HostPath), and at /dev in the container.
	DevRoot string `json:"devRoot,omitempty"`
	// MIGStrategy says how MIG devices are advertised: none (only whole
	// GPUs), single (MIG devices too, as resourceName) or mixed (each MIG
	// profile as nvidia.com/mig-<profile>).
	MIGStrategy string `json:"migStrategy,omitempty"`
	// Devices are the GPUs the device plugin advertises (indexes, GPU
	// UUIDs or PCI bus ids; a GPU brings its MIG devices); empty: all of
	// the node's GPUs. With dra.enabled both lists must be given, and
	// disjoint.
	Devices []string `json:"devices,omitempty"`
	// Sharing advertises GPUs as replicas that containers share
	// (timeSlicing or mps), in NVIDIA's device plugin's shape.
	Sharing DeviceSharing `json:"sharing,omitempty"`
	// SharedDevicesAllocationPolicy says which GPU's replicas the
	// kubelet is advised to give: distributed (the default: the GPU with
	// the fewest given out) or packed (the one with the most).
	SharedDevicesAllocationPolicy string `json:"sharedDevicesAllocationPolicy,omitempty"`
	// MPSRoot is the host directory of the MPS daemons nri-gpu mps runs:
	// <mpsRoot>/<GPU UUID>/{pipe,log}, and <mpsRoot>/shm, the daemons'
	// and their clients' /dev/shm. Containers mount from it.
	MPSRoot string `json:"mpsRoot,omitempty"`
}

// MIG strategies of the device plugin.
const (
	MIGStrategyNone   = sharing.MIGStrategyNone
	MIGStrategySingle = sharing.MIGStrategySingle
	MIGStrategyMixed  = sharing.MIGStrategyMixed
)

// CDIImport says which CDI devices to serve.
type CDIImport struct {
	// Kind is the vendor/class to serve ("amd.com/gpu").
	Kind string `json:"kind"`
	// SpecDirs are the CDI spec directories, read under hostRoot.
	SpecDirs []string `json:"specDirs,omitempty"`
	// AllowHooks lets devices whose specs carry OCI hooks be served.
	AllowHooks bool `json:"allowHooks,omitempty"`
	// AllowWritableMounts lets devices whose specs mount host paths
	// read-write (a mount without "ro" in its options) be served.
	AllowWritableMounts bool `json:"allowWritableMounts,omitempty"`
}

// LibraryMode is the value of the libraryMode key.
type LibraryMode string

// Library modes.
const (
	LibraryAuto      LibraryMode = "auto"
	LibraryDirectory LibraryMode = "directory"
	LibraryFiles     LibraryMode = "files"
)

// Layout is the value of the layout key.
type Layout string

// Layouts.
const (
	// LayoutNVIDIA puts binaries in BinaryDir (/usr/local/nvidia/bin),
	// one directory appended to PATH.
	LayoutNVIDIA Layout = "nvidia"
	// LayoutToolkit puts each binary at /usr/bin/<name>: one bind mount
	// per binary, slower to start.
	LayoutToolkit Layout = "toolkit"
)

// Firmware is the value of the firmware key.
type Firmware string

// Firmware modes.
const (
	FirmwareAuto  Firmware = "auto"
	FirmwareMount Firmware = "mount"
	FirmwareSkip  Firmware = "skip"
)

// Emit is the value of the emit key.
type Emit string

// Emit modes.
const (
	EmitEdits Emit = "edits"
	EmitCDI   Emit = "cdi"
)

// Sharing is the value of the sharing key (sharing.ParseMode reads it).
type Sharing string

// Sharing policies.
const (
	SharingShared    Sharing = "shared"
	SharingExclusive Sharing = "exclusive"
)

// The valid values of each mode key, in the order error messages list
// them.
var (
	libraryModes = []LibraryMode{LibraryAuto, LibraryDirectory, LibraryFiles}
	layouts      = []Layout{LayoutNVIDIA, LayoutToolkit}
	firmwares    = []Firmware{FirmwareAuto, FirmwareMount, FirmwareSkip}
	emits        = []Emit{EmitEdits, EmitCDI}
	sharings     = []Sharing{SharingShared, SharingExclusive}
)

// Defaults for the keys of Config.
const (
	DefaultHostRoot     = "/"
	DefaultDriverRoot   = "/"
	DefaultLibraryDir   = "/usr/local/nvidia/lib64"
	DefaultLibrary32Dir = "/usr/local/nvidia/lib"
	DefaultBinaryDir    = "/usr/local/nvidia/bin"
	DefaultLayout       = LayoutNVIDIA
	DefaultLibraryMode  = LibraryAuto
	DefaultLibraryCache = "/var/lib/nri-gpu"
	DefaultFirmware     = FirmwareAuto
	DefaultEmit         = EmitEdits
	DefaultSharing      = SharingShared
	// DefaultResourceName and DefaultDevicePluginDir are those of the
	// devicePlugin key (the kubelet's own directory).
	DefaultResourceName    = inventory.KindNVIDIA
	DefaultDevicePluginDir = "/var/lib/kubelet/device-plugins"
	// DefaultDevRoot is the host's device directory, as the kubelet
	// sees it (devicePlugin.devRoot).
	DefaultDevRoot = "/dev"
)

// DefaultCDISpecDirs are the CDI spec directories runtimes read by default.
var DefaultCDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// Default returns the configuration used when no file is given.
func Default() Config {
	c := Config{}
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.HostRoot == "" {
		c.HostRoot = DefaultHostRoot
	}
	if c.DriverRoot == "" {
		c.DriverRoot = DefaultDriverRoot
	}
	if c.DriverRootMount == "" {
		c.DriverRootMount = c.DriverRoot
	}
	if c.LibraryDir == "" {
		c.LibraryDir = DefaultLibraryDir
	}
	if c.Library32Dir == "" {
		c.Library32Dir = DefaultLibrary32Dir
	}
	if c.LibraryMode == "" {
		c.LibraryMode = DefaultLibraryMode
	}
	if c.LibraryCache == "" {
		c.LibraryCache = DefaultLibraryCache
	}
	if c.Firmware == "" {
		c.Firmware = DefaultFirmware
	}
	if c.Emit == "" {
		c.Emit = DefaultEmit
	}
	if c.Layout == "" {
		// A CDI spec can only replace PATH: with emit: cdi the runtime's
		// spec and nri-gpu's own edits (its fallback) both use /usr/bin.
		c.Layout = DefaultLayout
		if c.Emit == EmitCDI {
			c.Layout = LayoutToolkit
		}
	}
	if c.Layout == LayoutNVIDIA && c.BinaryDir == "" {
		c.BinaryDir = DefaultBinaryDir
	}
	if len(c.CDISpecDirs) == 0 {
		c.CDISpecDirs = append([]string(nil), DefaultCDISpecDirs...)
	}
	if c.CDIImport != nil && len(c.CDIImport.SpecDirs) == 0 {
		c.CDIImport.SpecDirs = append([]string(nil), DefaultCDISpecDirs...)
	}
	if c.Sharing == "" {
		c.Sharing = DefaultSharing
	}
	if c.DevicePlugin.ResourceName == "" {
		c.DevicePlugin.ResourceName = DefaultResourceName
	}
	if c.DevicePlugin.SocketDir == "" {
		c.DevicePlugin.SocketDir = DefaultDevicePluginDir
	}
	if c.DevicePlugin.DevRoot == "" {
		c.DevicePlugin.DevRoot = DefaultDevRoot
	}
	if c.DevicePlugin.MIGStrategy == "" {
		c.DevicePlugin.MIGStrategy = MIGStrategyNone
	}
	if c.DevicePlugin.SharedDevicesAllocationPolicy == "" {
		c.DevicePlugin.SharedDevicesAllocationPolicy = PolicyDistributed
	}
	if c.DevicePlugin.MPSRoot == "" {
		c.DevicePlugin.MPSRoot = DefaultMPSRoot
	}
	c.DevicePlugin.Sharing.setDefaults()
	c.DRA.setDefaults()
	c.Policy.SetDefaults()
	c.DevCharLinks.setDefaults()
	c.Health.setDefaults()
}

// Load reads the configuration file at path; see Parse.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse parses a YAML configuration, rejecting unknown, duplicate and
// wrongly cased keys at every depth, fills in the defaults and validates
// it.
func Parse(data []byte) (Config, error) {
	var c Config
	if err := decodeStrict(data, &c); err != nil {
		return Config{}, err
	}
	if err := c.DevicePlugin.Sharing.parseDevices(); err != nil {
		return Config{}, err
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// systemLibDirs are directories of images' own libraries, which a library
// directory mount must not cover.
var systemLibDirs = []string{"/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib",
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
	"/lib/i386-linux-gnu", "/usr/lib/i386-linux-gnu"}

// systemBinDirs are directories of images' own programs, which binaryDir
// must not cover.
var systemBinDirs = []string{"/", "/bin", "/sbin", "/usr", "/usr/bin", "/usr/sbin", "/usr/local", "/usr/local/bin", "/usr/local/sbin"}

// Validate checks that every path is absolute and clean and every mode one
// of its constants. The checks of a key, or of a few keys that depend on
// each other, are a function of their own, run in this order; the first
// error is returned. A new key's validation is one more such function and
// one more call here.
func (c Config) Validate() error {
	if err := c.Health.validate(); err != nil {
		return err
	}
	if err := c.validatePaths(); err != nil {
		return err
	}
	if err := c.validateLibraryDirs(); err != nil {
		return err
	}
	if err := checkMode("layout", "layout", c.Layout, layouts); err != nil {
		return err
	}
	if err := c.validateBinaryDir(); err != nil {
		return err
	}
	if err := checkMode("libraryMode", "mode", c.LibraryMode, libraryModes); err != nil {
		return err
	}
	if err := checkMode("firmware", "value", c.Firmware, firmwares); err != nil {
		return err
	}
	if err := checkMode("emit", "value", c.Emit, emits); err != nil {
		return err
	}
	for _, d := range c.CDISpecDirs {
		if err := checkPath("cdiSpecDirs", d); err != nil {
			return err
		}
	}
	if err := c.CDIImport.validate(); err != nil {
		return err
	}
	if err := checkCacheDir("libraryCache", c.LibraryCache); err != nil {
		return err
	}
	if c.LibraryCacheMount != "" {
		if err := checkCacheDir("libraryCacheMount", c.LibraryCacheMount); err != nil {
			return err
		}
	}
	if err := checkMode("sharing", "policy", c.Sharing, sharings); err != nil {
		return err
	}
	if c.LibraryDir == c.Library32Dir {
		return fmt.Errorf("keys libraryDir and library32Dir must differ (both %q)", c.LibraryDir)
	}
	if err := c.DevicePlugin.validate(); err != nil {
		return err
	}
	if err := c.DRA.validate(); err != nil {
		return err
	}
	if err := c.checkOneAllocator(); err != nil {
		return err
	}
	if err := c.DevCharLinks.validate(); err != nil {
		return err
	}
	return c.Policy.Validate()
}

// validatePaths checks the root and library paths: absolute, clean, and
// without ':' or NUL (they go into LD_LIBRARY_PATH and mount options).
func (c Config) validatePaths() error {
	for _, p := range []struct{ key, val string }{
		{"hostRoot", c.HostRoot},
		{"driverRoot", c.DriverRoot},
		{"driverRootMount", c.DriverRootMount},
		{"libraryDir", c.LibraryDir},
		{"library32Dir", c.Library32Dir},
		{"libraryCache", c.LibraryCache},
		{"libraryCacheMount", c.LibraryCacheMount},
	} {
		if p.val == "" && p.key == "libraryCacheMount" {
			continue
		}
		if err := checkPath(p.key, p.val); err != nil {
			return err
		}
		if strings.ContainsAny(p.val, ":\x00") {
			return fmt.Errorf("key %s: %q must not contain ':' or NUL", p.key, p.val)
		}
	}
	return nil
}

// validateLibraryDirs checks that libraryDir and library32Dir hide none of
// the image's own files.
func (c Config) validateLibraryDirs() error {
	for _, p := range []struct{ key, val string }{{"libraryDir", c.LibraryDir}, {"library32Dir", c.Library32Dir}} {
		if p.val == "/" {
			return fmt.Errorf("key %s: must not be /", p.key)
		}
		// In directory mode the prepared directory is mounted whole at
		// the library directory, hiding what the image has there (its
		// C library, in a system directory).
		if c.LibraryMode != LibraryFiles && (slices.Contains(systemLibDirs, p.val) || slices.Contains(systemBinDirs, p.val)) {
			return fmt.Errorf("key %s: %q would hide the image's own files (libraryMode %s mounts one directory there); use a directory images do not have, such as %s, or libraryMode: files", p.key, p.val, c.LibraryMode, map[string]string{"libraryDir": DefaultLibraryDir, "library32Dir": DefaultLibrary32Dir}[p.key])
		}
	}
	return nil
}

// validateBinaryDir checks binaryDir against the layout, the library
// directories and emit.
func (c Config) validateBinaryDir() error {
	if c.Layout == LayoutToolkit && c.BinaryDir != "" {
		return fmt.Errorf("key binaryDir: %q is not used with layout: toolkit (binaries at /usr/bin; the default with emit: cdi); remove binaryDir, or use layout: nvidia", c.BinaryDir)
	}
	if c.Layout == LayoutNVIDIA && c.BinaryDir == "" {
		return fmt.Errorf("key binaryDir: empty with layout: nvidia; use a directory such as %s, or layout: toolkit for binaries at /usr/bin", DefaultBinaryDir)
	}
	if c.BinaryDir == "" {
		return nil
	}
	if err := checkPath("binaryDir", c.BinaryDir); err != nil {
		return err
	}
	if strings.ContainsAny(c.BinaryDir, ":\x00") {
		return fmt.Errorf("key binaryDir: %q must not contain ':' or NUL", c.BinaryDir)
	}
	// A directory mount hides what the image has there.
	if slices.Contains(systemBinDirs, c.BinaryDir) {
		return fmt.Errorf("key binaryDir: %q would hide the image's own programs; use a directory images do not have, such as /usr/local/nvidia/bin", c.BinaryDir)
	}
	if c.BinaryDir == c.LibraryDir || c.BinaryDir == c.Library32Dir {
		return fmt.Errorf("key binaryDir: %q must differ from libraryDir and library32Dir", c.BinaryDir)
	}
	if c.Emit == EmitCDI {
		return fmt.Errorf("key layout: nvidia (binaryDir %s) not with emit: cdi (a CDI spec can only replace PATH, not append to it); use layout: toolkit, the default with emit: cdi", c.BinaryDir)
	}
	return nil
}

// validate checks cdiImport (nil: not set): a CDI kind of another vendor,
// and clean spec directories.
func (ci *CDIImport) validate() error {
	if ci == nil {
		return nil
	}
	vendor, class, ok := strings.Cut(ci.Kind, "/")
	if !ok || vendor == "" || class == "" || !strings.Contains(vendor, ".") {
		return fmt.Errorf("key cdiImport.kind: %q is not a CDI kind such as amd.com/gpu", ci.Kind)
	}
	if err := errors.Join(parser.ValidateVendorName(vendor), parser.ValidateClassName(class)); err != nil {
		return fmt.Errorf("key cdiImport.kind: %q is not a CDI kind such as amd.com/gpu: %s", ci.Kind, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if ci.Kind == inventory.KindNVIDIA {
		return fmt.Errorf("key cdiImport.kind: nvidia.com/gpu is served by nri-gpu's own discovery; remove cdiImport")
	}
	for _, d := range ci.SpecDirs {
		if err := checkPath("cdiImport.specDirs", d); err != nil {
			return err
		}
	}
	return nil
}

// systemTrees are directories of the operating system and of the
// container runtime: the library cache may be neither one of them nor in
// one of them.
var systemTrees = []string{"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr",
	"/run/containerd", "/run/crio", "/run/nri", "/var/run/nri", "/var/lib/containerd", "/var/lib/containers",
	"/var/lib/docker", "/var/lib/kubelet", "/var/lib/dpkg", "/var/lib/rpm", "/var/lib/apt", "/var/lib/systemd", "/var/log"}

// systemDirs are directories that hold other programs' directories: the
// library cache may be in one, but not be one.
var systemDirs = []string{"/", "/home", "/media", "/mnt", "/opt", "/root", "/run", "/srv", "/tmp", "/var", "/var/cache",
	"/var/lib", "/var/local", "/var/opt", "/var/run", "/var/spool", "/var/tmp"}

// checkCacheDir checks that p, the value of key (the library cache, where
// nri-gpu makes and removes directories), is not a system directory.
func checkCacheDir(key, p string) error {
	for _, t := range systemTrees {
		if p == t || strings.HasPrefix(p, t+"/") {
			return fmt.Errorf("key %s: %q is in the system directory %s, where nri-gpu must not make or remove directories; use a directory only nri-gpu uses, such as %s", key, p, t, DefaultLibraryCache)
		}
	}
	if slices.Contains(systemDirs, p) {
		return fmt.Errorf("key %s: %q is a system directory, where nri-gpu must not make or remove directories; use a directory only nri-gpu uses, such as %s", key, p, DefaultLibraryCache)
	}
	return nil
}

// checkPath checks that p, the value of key, is an absolute, clean path of
// printable characters.
func checkPath(key, p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("key %s: %q must be an absolute, clean path", key, p)
	}
	if strings.ContainsFunc(p, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return fmt.Errorf("key %s: %q must not contain control or other non-printable characters", key, p)
	}
	return nil
}

// checkMode checks that v, the value of key, is one of valid; the error
// names the key, the bad value and the valid ones.
func checkMode[T ~string](key, noun string, v T, valid []T) error {
	if slices.Contains(valid, v) {
		return nil
	}
	names := make([]string, len(valid))
	for i, m := range valid {
		names[i] = string(m)
	}
	return fmt.Errorf("key %s: unknown %s %q (valid: %s)", key, noun, v, strings.Join(names, ", "))
}

// validate checks the device plugin's resource name (an extended
// resource name, as the kubelet requires) and socket directory.
func (d DevicePlugin) validate() error {
	if err := checkPath("devicePlugin.socketDir", d.SocketDir); err != nil {
		return err
	}
	if err := checkPath("devicePlugin.devRoot", d.DevRoot); err != nil {
		return err
	}
	if strings.ContainsAny(d.SocketDir, ":\x00") {
		return fmt.Errorf("key devicePlugin.socketDir: %q must not contain ':' or NUL", d.SocketDir)
	}
	// The plugin's socket, nri-gpu-<resource>.sock in socketDir, must
	// fit in a unix socket address (108 bytes with its NUL).
	if l := len(d.SocketDir) + len("/nri-gpu-") + len(d.ResourceName) + len(".sock"); l > 107 {
		return fmt.Errorf("key devicePlugin.socketDir: %q: the device plugin's socket path would be %d bytes, more than a unix socket allows (107)", d.SocketDir, l)
	}
	if why := extendedResourceProblem(d.ResourceName); why != "" {
		return fmt.Errorf("key devicePlugin.resourceName: %q is not an extended resource name such as %s: %s", d.ResourceName, DefaultResourceName, why)
	}
	switch d.MIGStrategy {
	case MIGStrategyNone, MIGStrategySingle, MIGStrategyMixed:
	default:
		return fmt.Errorf("key devicePlugin.migStrategy: unknown strategy %q (valid: none, single, mixed)", d.MIGStrategy)
	}
	if err := checkDeviceList("devicePlugin.devices", d.Devices); err != nil {
		return err
	}
	return d.validateSharing()
}

// extendedResourceProblem says why name is not an extended resource name
// the kubelet accepts from a device plugin ("" if it is): <domain>/<name>,
// a DNS subdomain outside kubernetes.io, then a name of at most 63
// letters, digits, '-', '_' and '.', beginning and ending with a letter or
// digit.
func extendedResourceProblem(name string) string {
	domain, short, ok := strings.Cut(name, "/")
	switch {
	case !ok || domain == "" || short == "":
		return "it must be <domain>/<name>"
	case strings.Contains(short, "/"):
		return "it has more than one '/'"
	case len(domain) > 253:
		return "the domain is longer than 253 characters"
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || domain == "k8s.io" || strings.HasSuffix(domain, ".k8s.io"):
		return "the kubernetes.io and k8s.io domains are Kubernetes' own"
	case strings.HasPrefix(name, "requests."):
		return "it must not begin with requests."
	case len(short) > 63:
		return "the name after '/' is longer than 63 characters"
	}
	for _, label := range strings.Split(domain, ".") {
		if label == "" || len(label) > 63 || !alnum(label[0], false) || !alnum(label[len(label)-1], false) ||
			strings.ContainsFunc(label, func(r rune) bool { return r > 127 || !alnum(byte(r), false) && r != '-' }) {
			return fmt.Sprintf("the domain's label %q is not lower-case letters, digits and '-', beginning and ending with a letter or digit", label)
		}
	}
	if !alnum(short[0], true) || !alnum(short[len(short)-1], true) ||
		strings.ContainsFunc(short, func(r rune) bool { return r > 127 || !alnum(byte(r), true) && r != '-' && r != '_' && r != '.' }) {
		return fmt.Sprintf("the name %q after '/' is not letters, digits, '-', '_' and '.', beginning and ending with a letter or digit", short)
	}
	return ""
}

// alnum reports whether c is a digit or a lower-case letter (or, with
// upper, any ASCII letter).
func alnum(c byte, upper bool) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || upper && 'A' <= c && c <= 'Z'
}
