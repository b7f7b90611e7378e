package config

import "testing"

// FuzzParse fuzzes configuration files: any input is either rejected or
// yields a configuration that validates.
func FuzzParse(f *testing.F) {
	f.Add([]byte("hostRoot: /host\ndriverRoot: /run/nvidia/driver\n"))
	f.Add([]byte("policy:\n  annotationNamespaces: [ml]\n  visibleDevices: namespaces\n  envNamespaces: [legacy]\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("policy: [1, 2]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted %q but Validate says %v", data, err)
		}
	})
}
