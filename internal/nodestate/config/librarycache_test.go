package config

import (
	"strings"
	"testing"
)

// TestLibraryCacheSystemDirs checks that libraryCache and
// libraryCacheMount, where nri-gpu makes and removes directories, refuse
// the system's directories with an error naming the key, and accept a
// directory of nri-gpu's own.
func TestLibraryCacheSystemDirs(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"libraryCache: /usr/lib\n", `key libraryCache: "/usr/lib" is in the system directory /usr, where nri-gpu must not make or remove directories; use a directory only nri-gpu uses, such as /var/lib/nri-gpu`},
		{"libraryCache: /usr/lib/systemd\n", `key libraryCache: "/usr/lib/systemd" is in the system directory /usr`},
		{"libraryCache: /etc\n", `key libraryCache: "/etc" is in the system directory /etc`},
		{"libraryCache: /var/lib/kubelet/cache\n", `key libraryCache: "/var/lib/kubelet/cache" is in the system directory /var/lib/kubelet`},
		{"libraryCache: /var/lib\n", `key libraryCache: "/var/lib" is a system directory, where nri-gpu must not make or remove directories`},
		{"libraryCache: /tmp\n", `key libraryCache: "/tmp" is a system directory`},
		{"libraryCache: /\n", `key libraryCache: "/" is a system directory`},
		{"libraryCacheMount: /lib64\n", `key libraryCacheMount: "/lib64" is in the system directory /lib64`},
		{"libraryCacheMount: /var\n", `key libraryCacheMount: "/var" is a system directory`},
		{"libraryCacheMount: var/lib/nri-gpu\n", `key libraryCacheMount: "var/lib/nri-gpu" must be an absolute, clean path`},
		{"libraryCacheMount: /var/lib/nri:gpu\n", `key libraryCacheMount: "/var/lib/nri:gpu" must not contain ':'`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want %q", tc.yaml, err, tc.want)
		}
	}
	for _, ok := range []string{"", "libraryCache: /var/lib/nri-gpu\n", "libraryCache: /opt/nri-gpu/cache\n", "libraryCache: /usrlocal/nri\n",
		"libraryCacheMount: /var/lib/nri-gpu\n", "libraryCache: /var/lib/nri-gpu\nlibraryCacheMount: /nri-gpu-cache\n"} {
		if _, err := Parse([]byte(ok)); err != nil {
			t.Errorf("Parse(%q): %v", ok, err)
		}
	}
}
