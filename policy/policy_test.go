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
		{"device list always", secure, DeviceList, "web", true},
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
	if s := byNS.Setting(Env); !strings.Contains(s, "policy.envNamespaces: [legacy]") {
		t.Errorf("Setting = %q", s)
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
	} {
		err := tc.p.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.p, err, tc.want)
		}
	}
}
