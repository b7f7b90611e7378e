package config

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
)

// FuzzParse fuzzes configuration files. Parse must not panic; what it
// rejects yields the zero Config; what it accepts has every mode one of
// its constants and every path absolute and clean, and reads back the
// same once re-encoded as JSON or YAML.
func FuzzParse(f *testing.F) {
	f.Add([]byte("hostRoot: /host\ndriverRoot: /run/nvidia/driver\n"))
	f.Add([]byte("policy:\n  annotationNamespaces: [ml]\n  visibleDevices: namespaces\n  envNamespaces: [legacy]\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("policy: [1, 2]\n"))
	f.Add([]byte("policy:\n  default: deny\n  managementNamespaces: [gpu-operator]\n  deviceListNamespaces: [ml]\n"))
	f.Add([]byte("libraryMode: files\nfirmware: skip\nemit: cdi\nsharing: exclusive\ncdiSpecDirs: [/etc/cdi]\n"))
	f.Add([]byte("cdiImport: {kind: amd.com/gpu, specDirs: [/etc/cdi], allowHooks: yes}\n"))
	f.Add([]byte("cdiImport: {Kind: amd.com/gpu, SPECDIRS: [/etc/cdi], AllowHooks: true}\n"))
	f.Add([]byte("hostRoot: /\nhostRoot: /host\n"))
	f.Add([]byte("binaryDir: /usr/local/nvidia/bin\nlibraryDir: \"/opt/lib\\u00e9\"\n"))
	f.Add([]byte("ns: &ns [a, b]\npolicy: {cdiNamespaces: *ns}\n"))
	f.Add([]byte("cdiImport: {kind: \"amd.com/gpu\\u0080\"}\n"))
	f.Add([]byte("devicePlugin:\n  enabled: true\n  sharing:\n    timeSlicing:\n      renameByDefault: true\n      resources: [{name: nvidia.com/gpu, replicas: 4, devices: [0, \"1\"]}]\n"))
	f.Add([]byte("devicePlugin:\n  enabled: true\n  mpsRoot: /run/mps\n  sharing:\n    mps:\n      resources: [{name: nvidia.com/gpu, replicas: 2, devices: 1}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if !reflect.DeepEqual(c, Config{}) {
				t.Fatalf("Parse(%q) failed (%v) but returned %+v", data, err, c)
			}
			return
		}
		checkModes(t, data, c)
		checkPaths(t, data, c)
		j, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("Parse(%q) = %+v, which json.Marshal refuses: %v", data, c, err)
		}
		roundTrip(t, data, "JSON", j, c)
		y, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("Parse(%q) = %+v, which yaml.Marshal refuses: %v", data, c, err)
		}
		roundTrip(t, data, "YAML", y, c)
	})
}

func checkModes(t *testing.T, data []byte, c Config) {
	t.Helper()
	switch c.LibraryMode {
	case LibraryAuto, LibraryDirectory, LibraryFiles:
	default:
		t.Fatalf("Parse(%q) accepted libraryMode %q", data, c.LibraryMode)
	}
	switch c.Firmware {
	case FirmwareAuto, FirmwareMount, FirmwareSkip:
	default:
		t.Fatalf("Parse(%q) accepted firmware %q", data, c.Firmware)
	}
	switch c.Emit {
	case EmitEdits, EmitCDI:
	default:
		t.Fatalf("Parse(%q) accepted emit %q", data, c.Emit)
	}
	switch c.Sharing {
	case SharingShared, SharingExclusive:
	default:
		t.Fatalf("Parse(%q) accepted sharing %q", data, c.Sharing)
	}
	switch c.DevicePlugin.SharedDevicesAllocationPolicy {
	case PolicyDistributed, PolicyPacked:
	default:
		t.Fatalf("Parse(%q) accepted devicePlugin.sharedDevicesAllocationPolicy %q", data, c.DevicePlugin.SharedDevicesAllocationPolicy)
	}
	if _, rr := c.DevicePlugin.Sharing.Strategy(); rr != nil {
		for _, r := range rr.Resources {
			if r.Replicas < 2 || r.Devices.check("devices") != nil {
				t.Fatalf("Parse(%q) accepted replicated resource %+v", data, r)
			}
		}
	}
	switch c.Policy.VisibleDevices {
	case policy.VisibleDevicesAllow, policy.VisibleDevicesDeny, policy.VisibleDevicesNamespaces:
	default:
		t.Fatalf("Parse(%q) accepted policy.visibleDevices %q", data, c.Policy.VisibleDevices)
	}
	switch c.Policy.Default {
	case policy.DefaultAllow, policy.DefaultDeny:
	default:
		t.Fatalf("Parse(%q) accepted policy.default %q", data, c.Policy.Default)
	}
}

func checkPaths(t *testing.T, data []byte, c Config) {
	t.Helper()
	paths := map[string][]string{
		"hostRoot":        {c.HostRoot},
		"driverRoot":      {c.DriverRoot},
		"driverRootMount": {c.DriverRootMount},
		"libraryDir":      {c.LibraryDir},
		"library32Dir":    {c.Library32Dir},
		"libraryCache":    {c.LibraryCache},
		"cdiSpecDirs":     c.CDISpecDirs,
		"mpsRoot":         {c.DevicePlugin.MPSRoot},
	}
	if c.BinaryDir != "" {
		paths["binaryDir"] = []string{c.BinaryDir}
	}
	if c.LibraryCacheMount != "" {
		paths["libraryCacheMount"] = []string{c.LibraryCacheMount}
	}
	for _, key := range []string{"libraryCache", "libraryCacheMount"} {
		if p := paths[key]; len(p) == 1 && checkCacheDir(key, p[0]) != nil {
			t.Fatalf("Parse(%q) accepted %s %q, a system directory", data, key, p[0])
		}
	}
	if c.CDIImport != nil {
		paths["cdiImport.specDirs"] = c.CDIImport.SpecDirs
	}
	for key, ps := range paths {
		for _, p := range ps {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p {
				t.Fatalf("Parse(%q) accepted %s %q, not an absolute, clean path", data, key, p)
			}
		}
	}
}

// roundTrip checks that enc, c encoded, parses back to c.
func roundTrip(t *testing.T, data []byte, format string, enc []byte, c Config) {
	t.Helper()
	back, err := Parse(enc)
	if err != nil {
		t.Fatalf("Parse(%q) = %+v, whose %s %q Parse refuses: %v", data, c, format, enc, err)
	}
	if diff := cmp.Diff(c, back, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("Parse(%q) re-encoded as %s %q reads differently (-first +second):\n%s", data, format, enc, diff)
	}
}
