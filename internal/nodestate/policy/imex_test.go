package policy

import "testing"

// TestIMEXPolicy: IMEX channels are a request kind of their own, decided
// by policy.imexNamespaces; an empty list follows policy.default.
func TestIMEXPolicy(t *testing.T) {
	open := Policy{}
	open.SetDefaults()
	closed := Policy{Default: DefaultDeny}
	closed.SetDefaults()
	listed := Policy{Default: DefaultDeny, IMEXNamespaces: []string{"nvl72"}}
	listed.SetDefaults()
	// Other sources allowed do not allow IMEX channels.
	annotations := Policy{Default: DefaultDeny, AnnotationNamespaces: []string{"ml"}, DeviceListNamespaces: []string{"ml"}}
	annotations.SetDefaults()
	for _, tc := range []struct {
		name string
		p    Policy
		ns   string
		want bool
	}{
		{"default allow: any namespace", open, "x", true},
		{"default deny: nobody", closed, "nvl72", false},
		{"listed", listed, "nvl72", true},
		{"unlisted", listed, "ml", false},
		{"annotations allowed, IMEX not", annotations, "ml", false},
	} {
		if got := tc.p.Allows(IMEX, tc.ns); got != tc.want {
			t.Errorf("%s: Allows(IMEX, %q) = %v", tc.name, tc.ns, got)
		}
	}
	if s := closed.Setting(IMEX); s != "policy.imexNamespaces: [] (none: policy.default is deny)" {
		t.Errorf("Setting = %q", s)
	}
	if err := (Policy{Default: DefaultAllow, VisibleDevices: VisibleDevicesAllow, IMEXNamespaces: []string{"Bad_NS"}}).Validate(); err == nil || err.Error() != `key policy.imexNamespaces: "Bad_NS" is not a Kubernetes namespace name (lower-case letters, digits and '-', at most 63)` {
		t.Errorf("Validate of a bad imexNamespaces entry: %v", err)
	}
}
