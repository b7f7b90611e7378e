package inventory

import (
	"strings"
	"testing"
)

func TestDriverProblem(t *testing.T) {
	lib := func(p string) DriverFile { return DriverFile{Kind: Library, HostPath: p, Name: "x.so.1"} }
	for _, tc := range []struct {
		name string
		snap Snapshot
		want string // substring; "" means no problem
	}{
		{"no driver", Snapshot{}, ""},
		{"good", Snapshot{DriverVersion: "580.1", Files: []DriverFile{lib("/usr/lib64/libcuda.so.580.1")}}, ""},
		{"no library", Snapshot{DriverVersion: "580.1", DriverRoot: "/d", Files: []DriverFile{{Kind: Binary, HostPath: "/usr/bin/nvidia-smi"}}},
			"no driver library was found under driverRoot /d"},
		{"one stale", Snapshot{DriverVersion: "590.2", Files: []DriverFile{lib("/usr/lib64/libcuda.so.590.2"), lib("/usr/lib64/libnvidia-ml.so.580.1")}},
			"/usr/lib64/libnvidia-ml.so.580.1 does not carry the kernel module's version 590.2"},
		{"all stale", Snapshot{DriverVersion: "590.2", Files: []DriverFile{lib("/a/libcuda.so.580.1"), lib("/a/libnvidia-ml.so.580.1")}},
			"2 of 2 driver libraries (/a/libcuda.so.580.1, ...)"},
		{"own version", Snapshot{DriverVersion: "580.1", Files: []DriverFile{lib("/a/libcuda.so.580.1"),
			{Kind: Library, HostPath: "/a/libnvidia-egl-gbm.so.1.1.2", Name: "libnvidia-egl-gbm.so.1", OwnVersion: true}}}, ""},
		{"prefix is not a match", Snapshot{DriverVersion: "80.1", Files: []DriverFile{lib("/a/libcuda.so.580.1")}}, "does not carry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.snap.DriverProblem()
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("DriverProblem() = %q, want %q", got, tc.want)
			}
		})
	}
}
