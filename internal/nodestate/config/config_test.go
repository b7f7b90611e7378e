package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
)

func TestParse(t *testing.T) {
	c, err := Parse([]byte("hostRoot: /host\ndriverRoot: /run/nvidia/driver\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{HostRoot: "/host", DriverRoot: "/run/nvidia/driver", DriverRootMount: "/run/nvidia/driver",
		LibraryDir: DefaultLibraryDir, Library32Dir: DefaultLibrary32Dir,
		LibraryMode: "auto", LibraryCache: "/var/lib/nri-gpu", Firmware: "auto",
		Layout: LayoutNVIDIA, BinaryDir: DefaultBinaryDir,
		Emit: "edits", CDISpecDirs: []string{"/etc/cdi", "/var/run/cdi"}, Sharing: "shared",
		Policy:       policy.Policy{Default: "allow", VisibleDevices: "allow"},
		DevicePlugin: DevicePlugin{ResourceName: "nvidia.com/gpu", SocketDir: "/var/lib/kubelet/device-plugins", DevRoot: "/dev", MIGStrategy: "none", SharedDevicesAllocationPolicy: "distributed", MPSRoot: "/run/nri-gpu/mps"},
		DevCharLinks: DevCharLinks{Enabled: ptr(true)},
		Health:       Health{IgnoredXIDs: []uint64{13, 31, 43, 45, 68, 109}},
		DRA: DRA{DriverName: "gpu.nri-gpu.dev", PluginDir: "/var/lib/kubelet/plugins/gpu.nri-gpu.dev",
			RegistrationDir: "/var/lib/kubelet/plugins_registry", CDIDir: "/var/run/cdi", MemoryShares: DRAMemoryShares{Minimum: DefaultMemoryShareMinimum}}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got %+v, want %+v", c, want)
	}
	if c, err := Parse(nil); err != nil || !reflect.DeepEqual(c, Default()) {
		t.Errorf("empty config: %+v, %v", c, err)
	}
	if c, err := Parse([]byte("libraryDir: /usr/lib64\nlibraryMode: files\n")); err != nil || c.LibraryDir != "/usr/lib64" {
		t.Errorf("a system library directory with libraryMode files (one mount per file): %+v, %v", c, err)
	}
	if c, err := Parse([]byte("binaryDir: /opt/nvidia/bin\n")); err != nil || c.BinaryDir != "/opt/nvidia/bin" || c.Layout != LayoutNVIDIA {
		t.Errorf("binaryDir: %+v, %v", c, err)
	}
	for _, v := range []Firmware{FirmwareAuto, FirmwareMount, FirmwareSkip} {
		if c, err := Parse([]byte("firmware: " + v + "\n")); err != nil || c.Firmware != v {
			t.Errorf("firmware %s: %+v, %v", v, c, err)
		}
	}
	if c, err := Parse([]byte("sharing: exclusive\n")); err != nil || c.Sharing != "exclusive" {
		t.Errorf("sharing: %+v, %v", c, err)
	}
}

// TestLayout checks the layout key: nvidia by default (binaries in
// /usr/local/nvidia/bin), toolkit on request (binaries at /usr/bin, no
// binaryDir), and toolkit by default with emit: cdi, whose specs can only
// replace PATH.
func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		yaml   string
		layout Layout
		bin    string
	}{
		{"", LayoutNVIDIA, "/usr/local/nvidia/bin"},
		{"layout: nvidia\n", LayoutNVIDIA, "/usr/local/nvidia/bin"},
		{"layout: nvidia\nbinaryDir: /opt/nvidia/bin\n", LayoutNVIDIA, "/opt/nvidia/bin"},
		{"layout: toolkit\n", LayoutToolkit, ""},
		{"emit: cdi\n", LayoutToolkit, ""},
		{"emit: cdi\nlayout: toolkit\n", LayoutToolkit, ""},
	} {
		c, err := Parse([]byte(tc.yaml))
		if err != nil || c.Layout != tc.layout || c.BinaryDir != tc.bin {
			t.Errorf("Parse(%q): layout %q binaryDir %q (%v), want %q %q", tc.yaml, c.Layout, c.BinaryDir, err, tc.layout, tc.bin)
		}
	}
	if d := Default(); d.Layout != LayoutNVIDIA || d.BinaryDir != DefaultBinaryDir || d.LibraryDir != "/usr/local/nvidia/lib64" || d.Library32Dir != "/usr/local/nvidia/lib" {
		t.Errorf("defaults: %+v", d)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"hostroot: /\n", `unknown field "hostroot"`},
		{"hostRoot: /\nfoo: 1\n", `unknown field "foo"`},
		{"hostRoot: [1]\n", `hostRoot`},
		{"hostRoot: relative\n", `key hostRoot: "relative" must be an absolute, clean path`},
		{"driverRoot: /a/../b\n", `key driverRoot: "/a/../b" must be an absolute, clean path`},
		{"libraryDir: /\n", `key libraryDir: must not be /`},
		{"libraryDir: /a:/b\n", `must not contain ':'`},
		{"libraryDir: /x\nlibrary32Dir: /x\n", `must differ`},
		{"hostRoot: /\n\tbad", `yaml`},
		{"emit: both\n", `key emit: unknown value "both" (valid: edits, cdi)`},
		{"cdiSpecDirs: [etc/cdi]\n", `key cdiSpecDirs: "etc/cdi" must be an absolute, clean path`},
		{"libraryMode: fast\n", `key libraryMode: unknown mode "fast" (valid: auto, directory, files)`},
		{"libraryDir: /usr/lib64\n", `key libraryDir: "/usr/lib64" would hide the image's own files (libraryMode auto mounts one directory there); use a directory images do not have, such as /usr/local/nvidia/lib64, or libraryMode: files`},
		{"library32Dir: /usr/lib/i386-linux-gnu\nlibraryMode: directory\n", `key library32Dir: "/usr/lib/i386-linux-gnu" would hide the image's own files (libraryMode directory`},
		{"binaryDir: usr/local/nvidia/bin\n", `key binaryDir: "usr/local/nvidia/bin" must be an absolute, clean path`},
		{"binaryDir: /usr/bin\n", `key binaryDir: "/usr/bin" would hide the image's own programs`},
		{"binaryDir: /opt/a:/b\n", `key binaryDir: "/opt/a:/b" must not contain ':'`},
		{"binaryDir: /usr/local/nvidia/lib64\n", `key binaryDir: "/usr/local/nvidia/lib64" must differ from libraryDir`},
		{"binaryDir: /usr/local/nvidia/bin\nemit: cdi\n", `key binaryDir: "/usr/local/nvidia/bin" is not used with layout: toolkit (binaries at /usr/bin; the default with emit: cdi)`},
		{"layout: nvidia\nemit: cdi\n", `key layout: nvidia (binaryDir /usr/local/nvidia/bin) not with emit: cdi`},
		{"layout: toolkit\nbinaryDir: /opt/bin\n", `key binaryDir: "/opt/bin" is not used with layout: toolkit`},
		{"layout: usr-bin\n", `key layout: unknown layout "usr-bin" (valid: nvidia, toolkit)`},
		{"layout: Toolkit\n", `key layout: unknown layout "Toolkit" (valid: nvidia, toolkit)`},
		{"Layout: toolkit\n", `unknown field "Layout": keys are case-sensitive, did you mean "layout"?`},
		{"firmware: always\n", `key firmware: unknown value "always" (valid: auto, mount, skip)`},
		{"libraryCache: var/lib\n", `key libraryCache: "var/lib" must be an absolute, clean path`},
		{"sharing: Exclusive\n", `key sharing: unknown policy "Exclusive" (valid: shared, exclusive)`},
		{"policy:\n  visibleDevices: maybe\n", `key policy.visibleDevices: "maybe" is not a valid mode (valid: allow, deny, namespaces)`},
		{"policy:\n  visibleDevices: namespaces\n", `key policy.envNamespaces: must list at least one namespace`},
		{"policy:\n  envNamespaces: [ml]\n", `key policy.envNamespaces: only used with policy.visibleDevices: namespaces`},
		{"policy:\n  default: none\n", `key policy.default: "none" is not a valid mode (valid: allow, deny)`},
		{"policy:\n  cdiNamespaces: [Bad_NS]\n", `key policy.cdiNamespaces: "Bad_NS" is not a Kubernetes namespace name`},
		{"policy:\n  annotationnamespaces: [a]\n", `key policy: unknown field "annotationnamespaces"`},
		{"policy:\n  visibleDevice: deny\n", `unknown field "visibleDevice"`},
		{"policy: deny\n", `policy`},
		{"libraryDir: \"/opt/lib\\x80\"\n", `key libraryDir: "/opt/lib\u0080" must not contain control or other non-printable characters`},
		{"cdiImport:\n  specDirs: [\"/etc/cdi\\t\"]\n  kind: amd.com/gpu\n", `key cdiImport.specDirs: "/etc/cdi\t" must not contain control`},
		{"cdiImport: {kind: amd.com/g pu}\n", `key cdiImport.kind: "amd.com/g pu" is not a CDI kind such as amd.com/gpu: invalid class. invalid character ' '`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) error %v, want one containing %q", tc.yaml, err, tc.want)
		}
	}
}

// TestParseStrictKeys checks that keys are refused at every depth when
// unknown, repeated or spelled in another case, and that the error names
// the key's path and the valid keys of its level.
func TestParseStrictKeys(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want []string
	}{
		{"cdiImport: {Kind: amd.com/gpu}\n", []string{`key cdiImport: unknown field "Kind": keys are case-sensitive, did you mean "kind"?`}},
		{"cdiImport: {kind: amd.com/gpu, SPECDIRS: [/etc/cdi]}\n", []string{`key cdiImport: unknown field "SPECDIRS": keys are case-sensitive, did you mean "specDirs"?`}},
		{"cdiImport: {kind: amd.com/gpu, AllowHooks: true}\n", []string{`key cdiImport: unknown field "AllowHooks": keys are case-sensitive, did you mean "allowHooks"?`}},
		{"cdiImport: {Kind: amd.com/gpu, SPECDIRS: [/etc/cdi], AllowHooks: true}\n", []string{
			`key cdiImport: unknown field "Kind"`, `key cdiImport: unknown field "SPECDIRS"`, `key cdiImport: unknown field "AllowHooks"`,
			`(valid keys: kind, specDirs, allowHooks, allowWritableMounts)`}},
		{"cdiImport:\n  kind: amd.com/gpu\n  vendor: amd\n", []string{`key cdiImport: unknown field "vendor" (valid keys: kind, specDirs, allowHooks, allowWritableMounts)`}},
		{"policy:\n  envNamespace: [ml]\n", []string{`key policy: unknown field "envNamespace" (valid keys: default, annotationNamespaces, cdiNamespaces, managementNamespaces, deviceListNamespaces, visibleDevices, envNamespaces, imexNamespaces)`}},
		{"HostRoot: /host\n", []string{`unknown field "HostRoot": keys are case-sensitive, did you mean "hostRoot"?`, `(valid keys: hostRoot, driverRoot, `}},
		{"libraryMODE: files\n", []string{`unknown field "libraryMODE"`, `did you mean "libraryMode"?`}},
		{"policy:\n  VisibleDevices: deny\n", []string{`key policy: unknown field "VisibleDevices"`, `did you mean "visibleDevices"?`}},
		{"policy:\n  CDINamespaces: [ml]\n", []string{`key policy: unknown field "CDINamespaces"`, `did you mean "cdiNamespaces"?`}},
		{"hostRoot: /\nhostRoot: /host\n", []string{`duplicate field "hostRoot"`}},
		{"cdiImport:\n  kind: amd.com/gpu\n  kind: amd.com/gpu\n", []string{`key cdiImport: duplicate field "kind"`}},
		{"policy:\n  cdiNamespaces: [a]\n  cdiNamespaces: [b]\n", []string{`key policy: duplicate field "cdiNamespaces"`}},
		{"policy:\n  envNamespaces: [123]\n", []string{`key policy.envNamespaces: expected a string, got a number (quote it`}},
		{"cdiImport: {kind: amd.com/gpu, allowHooks: maybe}\n", []string{`key cdiImport.allowHooks: expected a boolean, got a string`}},
		{"cdiImport: {kind: amd.com/gpu, allowWritableMounts: rw}\n", []string{`key cdiImport.allowWritableMounts: expected a boolean, got a string`}},
		{"cdiImport: {kind: amd.com/gpu, AllowWritableMounts: true}\n", []string{`key cdiImport: unknown field "AllowWritableMounts": keys are case-sensitive, did you mean "allowWritableMounts"?`}},
		{"- hostRoot: /\n", []string{`the configuration must be a mapping of keys, not a list`}},
	} {
		_, err := Parse([]byte(tc.yaml))
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Parse(%q) error %v, want one containing %q", tc.yaml, err, w)
			}
		}
	}
	// The valid keys are the json tags, all of them.
	_, err := Parse([]byte("bogus: 1\n"))
	want := `unknown field "bogus" (valid keys: hostRoot, driverRoot, driverRootMount, libraryDir, library32Dir, libraryMode, libraryCache, libraryCacheMount, layout, binaryDir, firmware, emit, cdiSpecDirs, sharing, cdiImport, policy, devicePlugin, devCharLinks, health, dra, events)`
	if err == nil || err.Error() != want {
		t.Errorf("unknown key: %v, want %s", err, want)
	}
	// Correctly spelled nested keys decode.
	c, err := Parse([]byte("cdiImport: {kind: amd.com/gpu, specDirs: [/etc/cdi], allowHooks: yes}\n"))
	if err != nil || c.CDIImport == nil || c.CDIImport.Kind != "amd.com/gpu" || !c.CDIImport.AllowHooks || !reflect.DeepEqual(c.CDIImport.SpecDirs, []string{"/etc/cdi"}) {
		t.Errorf("cdiImport: %+v, %v", c.CDIImport, err)
	}
	if c.CDIImport != nil && c.CDIImport.AllowWritableMounts {
		t.Errorf("cdiImport.allowWritableMounts is on unless set")
	}
	c, err = Parse([]byte("cdiImport: {kind: amd.com/gpu, allowWritableMounts: true}\n"))
	if err != nil || c.CDIImport == nil || !c.CDIImport.AllowWritableMounts {
		t.Errorf("cdiImport.allowWritableMounts: %+v, %v", c.CDIImport, err)
	}
}

func TestLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("missing file: %v", err)
	}
	os.WriteFile(p, []byte("bogus: 1\n"), 0o644)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("bad file: %v", err)
	}
}

func TestParsePolicy(t *testing.T) {
	c, err := Parse([]byte(`
policy:
  annotationNamespaces: [ml, research]
  cdiNamespaces: [ml]
  managementNamespaces: [gpu-operator]
  deviceListNamespaces: [ml]
  visibleDevices: namespaces
  envNamespaces: [legacy]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := policy.Policy{Default: "allow", AnnotationNamespaces: []string{"ml", "research"}, CDINamespaces: []string{"ml"},
		ManagementNamespaces: []string{"gpu-operator"}, DeviceListNamespaces: []string{"ml"}, VisibleDevices: "namespaces", EnvNamespaces: []string{"legacy"}}
	if diff := cmp.Diff(want, c.Policy); diff != "" {
		t.Errorf("policy (-want +got):\n%s", diff)
	}
	c, err = Parse([]byte("policy:\n  default: deny\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (policy.Policy{Default: "deny", VisibleDevices: "deny"}); !cmp.Equal(want, c.Policy) {
		t.Errorf("policy.default: deny: %+v, want %+v", c.Policy, want)
	}
}
