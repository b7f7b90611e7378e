package policy

import (
	"strings"
	"testing"
)

func TestAllows(t *testing.T) {
	open := Policy{}
	open.SetDefaults()
	secure := Policy{
		AnnotationNamespaces: []string{"ml"},
		CDINamespaces:        []string{"ml"},
		ManagementNamespaces: []string{"gpu-operator"},
		VisibleDevices:       VisibleDevicesDeny,
	}
	byNS := Policy{VisibleDevices: VisibleDevicesNamespaces, EnvNamespaces: []string{"legacy"}}
	closed := Policy{Default: DefaultDeny}
	closed.SetDefaults()
	closedOps := Policy{Default: DefaultDeny, ManagementNamespaces: []string{"gpu-operator"}}
	closedOps.SetDefaults()
	for _, tc := range []struct {
		name string
		p    Policy
		s    Source
		ns   string
		want bool
	}{
		{"default allows annotations", open, Annotation, "x", true},
		{"default allows env", open, Env, "x", true},
		{"default allows management", open, Management, "x", true},
		{"zero policy allows env", Policy{}, Env, "x", true},
		{"listed annotation", secure, Annotation, "ml", true},
		{"unlisted annotation", secure, Annotation, "web", false},
		{"unlisted CDI", secure, CDI, "web", false},
		{"management listed", secure, Management, "gpu-operator", true},
		{"management unlisted", secure, Management, "ml", false},
		{"env denied", secure, Env, "ml", false},
		{"device list always a request", secure, DeviceList, "web", true},
		{"default deny: device list a request", closed, DeviceList, "web", true},
		{"default deny: empty annotation list is nobody", closed, Annotation, "ml", false},
		{"default deny: empty CDI list is nobody", closed, CDI, "ml", false},
		{"default deny: empty management list is nobody", closed, Management, "gpu-operator", false},
		{"default deny: env denied", closed, Env, "ml", false},
		{"default deny: listed management", closedOps, Management, "gpu-operator", true},
		{"default deny: unlisted management", closedOps, Management, "ml", false},
		{"env by namespace: listed", byNS, Env, "legacy", true},
		{"env by namespace: unlisted", byNS, Env, "ml", false},
		{"unknown source", open, Source(0), "x", false},
	} {
		if got := tc.p.Allows(tc.s, tc.ns); got != tc.want {
			t.Errorf("%s: Allows(%v, %q) = %v", tc.name, tc.s, tc.ns, got)
		}
	}
	if s := secure.Setting(Annotation); s != "policy.annotationNamespaces: [ml]" {
		t.Errorf("Setting = %q", s)
	}
	if s := closed.Setting(Management); s != "policy.managementNamespaces: [] (none: policy.default is deny)" {
		t.Errorf("Setting = %q", s)
	}
	if s := closed.Setting(Env); s != "policy.visibleDevices: deny" {
		t.Errorf("Setting = %q", s)
	}
	if s := byNS.Setting(Env); !strings.Contains(s, "policy.envNamespaces: [legacy]") {
		t.Errorf("Setting = %q", s)
	}
}

// TestTrustsDeviceList: the device plugin's mount list names GPUs on its
// own only where the policy lists it (or everywhere, by default allow).
func TestTrustsDeviceList(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		ns   string
		want bool
	}{
		{Policy{}, "web", true},
		{Policy{Default: DefaultAllow}, "web", true},
		{Policy{Default: DefaultDeny}, "web", false},
		{Policy{Default: DefaultDeny, DeviceListNamespaces: []string{"ml"}}, "ml", true},
		{Policy{Default: DefaultDeny, DeviceListNamespaces: []string{"ml"}}, "web", false},
		{Policy{DeviceListNamespaces: []string{"ml"}}, "web", false},
	} {
		if got := tc.p.TrustsDeviceList(tc.ns); got != tc.want {
			t.Errorf("%+v: TrustsDeviceList(%q) = %v, want %v", tc.p, tc.ns, got, tc.want)
		}
	}
}

func TestSetDefaults(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		want Policy
	}{
		{Policy{}, Policy{Default: DefaultAllow, VisibleDevices: VisibleDevicesAllow}},
		{Policy{Default: DefaultDeny}, Policy{Default: DefaultDeny, VisibleDevices: VisibleDevicesDeny}},
		{Policy{Default: DefaultDeny, VisibleDevices: VisibleDevicesAllow}, Policy{Default: DefaultDeny, VisibleDevices: VisibleDevicesAllow}},
	} {
		got := tc.p
		got.SetDefaults()
		if got.Default != tc.want.Default || got.VisibleDevices != tc.want.VisibleDevices {
			t.Errorf("%+v: SetDefaults = %+v, want %+v", tc.p, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		want string
	}{
		{Policy{VisibleDevices: "allow"}, ""},
		{Policy{VisibleDevices: "deny", AnnotationNamespaces: []string{"a-1", "kube-system"}}, ""},
		{Policy{VisibleDevices: "namespaces", EnvNamespaces: []string{"x"}}, ""},
		{Policy{VisibleDevices: "Allow"}, `"Allow" is not a valid mode`},
		{Policy{VisibleDevices: "namespaces"}, "must list at least one namespace"},
		{Policy{VisibleDevices: "allow", EnvNamespaces: []string{"x"}}, "only used with"},
		{Policy{VisibleDevices: "allow", ManagementNamespaces: []string{"-x"}}, "policy.managementNamespaces"},
		{Policy{VisibleDevices: "allow", AnnotationNamespaces: []string{strings.Repeat("a", 64)}}, "not a Kubernetes namespace"},
		{Policy{VisibleDevices: "allow", CDINamespaces: []string{""}}, "not a Kubernetes namespace"},
		{Policy{Default: "deny", VisibleDevices: "deny"}, ""},
		{Policy{Default: "none", VisibleDevices: "deny"}, `key policy.default: "none" is not a valid mode (valid: allow, deny)`},
		{Policy{VisibleDevices: "allow", DeviceListNamespaces: []string{"ML"}}, "key policy.deviceListNamespaces"},
	} {
		err := tc.p.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.p, err, tc.want)
		}
	}
}
