package config

import (
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

// TestDevCharLinks checks the devCharLinks key: on by default, switched
// off by enabled: false, its state directory, and strict decoding.
func TestDevCharLinks(t *testing.T) {
	c, err := Parse(nil)
	if err != nil || !c.DevCharLinks.On() || c.DevCharLinks.StateDirUnder("/host") != "/host/run/nri-gpu" {
		t.Errorf("default devCharLinks: %+v, %v; want on, hostRoot + /run/nri-gpu", c.DevCharLinks, err)
	}
	c, err = Parse([]byte("devCharLinks:\n  enabled: false\n  stateDir: /var/lib/nri-gpu\n"))
	if err != nil || c.DevCharLinks.On() || c.DevCharLinks.StateDirUnder("/host") != "/var/lib/nri-gpu" {
		t.Errorf("devCharLinks off: %+v, %v", c.DevCharLinks, err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"devCharLinks:\n  enable: false\n", `key devCharLinks: unknown field "enable" (valid keys: enabled, stateDir)`},
		{"devCharLinks: false\n", `devCharLinks`},
		{"devCharLinks:\n  enabled: no thanks\n", `devCharLinks.enabled`},
		{"devCharLinks:\n  stateDir: run/nri-gpu\n", `key devCharLinks.stateDir: "run/nri-gpu" must be an absolute, clean path`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
