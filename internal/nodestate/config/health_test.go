package config

import (
	"slices"
	"strings"
	"testing"
)

func TestHealthConfig(t *testing.T) {
	c, err := Parse([]byte("health:\n  ignoredXIDs: [13, 48]\n"))
	if err != nil || !slices.Equal(c.Health.IgnoredXIDs, []uint64{13, 48}) {
		t.Errorf("ignoredXIDs [13, 48]: %v, %v", c.Health.IgnoredXIDs, err)
	}
	c, err = Parse([]byte("health:\n  ignoredXIDs: []\n"))
	if err != nil || c.Health.IgnoredXIDs == nil || len(c.Health.IgnoredXIDs) != 0 {
		t.Errorf("ignoredXIDs []: %v, %v (want none ignored)", c.Health.IgnoredXIDs, err)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"health:\n  ignoredXIDs: [0]\n", "key health.ignoredXIDs: 0 is not an XID (valid: 1 to 65535)"},
		{"health:\n  ignoredXIDs: [70000]\n", "key health.ignoredXIDs: 70000 is not an XID"},
		{"health:\n  ignoredXIDs: [-1]\n", "ignoredXIDs"},
		{"health:\n  ignoreXIDs: [13]\n", `unknown field "ignoreXIDs"`},
	} {
		if _, err := Parse([]byte(bad.yaml)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want %q", bad.yaml, err, bad.want)
		}
	}
}
