package config

import "testing"

// TestLine: a Parse error names a key, and Line finds the key's line in
// the file (the last of a duplicate key; the item of a list; the mapping
// of an unknown key's parent when the key is not there); "" for an error
// that names none.
func TestLine(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"top key", "hostRoot: /\nsharing: solo\n", ":2"},
		{"unknown key below", "hostRoot: /\npolicy:\n  default: deny\n  envnamespaces: [a]\n", ":4"},
		{"unknown top key", "hostRoot: /\n\nbogus: 1\n", ":3"},
		{"duplicate key", "hostRoot: /\nemit: edits\nhostRoot: /x\n", ":3"},
		{"list item", "devicePlugin:\n  enabled: true\n  sharing:\n    timeSlicing:\n      resources:\n      - name: nvidia.com/gpu\n        replicas: -1\n", ":7"},
		{"no key", "hostRoot: [\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.data))
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			if got := Line([]byte(tc.data), err); got != tc.want {
				t.Errorf("Line = %q, want %q (error: %v)", got, tc.want, err)
			}
		})
	}
}
