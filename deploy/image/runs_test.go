package image_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// unpackLayer writes the layer of the image of arch into dir, as a
// runtime's snapshotter would.
func unpackLayer(t *testing.T, archivePath, arch, dir string) {
	t.Helper()
	img, ok := readArchive(t, archivePath).images[arch]
	if !ok {
		t.Fatalf("%s has no %s image", archivePath, arch)
	}
	for _, h := range img.layer {
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		var err error
		switch h.Type {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode))
		case tar.TypeReg:
			err = os.WriteFile(p, img.contents["/"+h.Name], os.FileMode(h.Mode))
		default:
			t.Fatalf("layer entry %s of type %c", h.Name, h.Type)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestRunsInImageRoot runs each platform's binary in its image's root
// file system alone, as the DaemonSet's container runs it: the amd64 one
// chrooted into it (nothing of the build machine's); the arm64 one with
// qemu-user's qemu-aarch64 -L, which resolves the binary's loader and
// every absolute path in the image's root first (a Grace node's userland
// emulated, the build machine's /proc and kernel beneath). It reports
// the image's version, and `nri-gpu inventory` on a simulated node of the
// platform under /host loads the node's libnvidia-ml.so.1 (a glibc shared
// object built with gcc for that machine) with the image's loader and
// libraries. Needs root (chroot, device nodes); arm64 also an arm64
// simulated node (simnode.CanBuild: .ci/run installs what it needs).
func TestRunsInImageRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chroot into the image's root file system and mknod for the simulated node (CI runs as root)")
	}
	m := testImage(t)
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			root := t.TempDir()
			unpackLayer(t, m.tar, arch, root)
			run := func(args ...string) string {
				t.Helper()
				cmd := exec.Command("/usr/bin/nri-gpu", args...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
				cmd.Dir = "/"
				cmd.Env = []string{"PATH=/usr/bin"}
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("nri-gpu %s in the image's root: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
				}
				return string(out)
			}
			if arch == "arm64" {
				if err := simnode.CanBuild(arch); err != nil {
					t.Skipf("needs an arm64 simulated node: %v", err)
				}
				qemu, err := exec.LookPath("qemu-aarch64")
				if err != nil {
					t.Fatalf("qemu-aarch64 (Debian's qemu-user), which make image needs too: %v", err)
				}
				run = func(args ...string) string {
					t.Helper()
					cmd := exec.Command(qemu, append([]string{"-L", root, filepath.Join(root, "usr/bin/nri-gpu")}, args...)...)
					cmd.Dir = root
					cmd.Env = []string{"PATH=/usr/bin"}
					var stderr bytes.Buffer
					cmd.Stderr = &stderr
					out, err := cmd.Output()
					if err != nil {
						t.Fatalf("qemu-aarch64 -L %s nri-gpu %s: %v\n%s%s", root, strings.Join(args, " "), err, out, stderr.Bytes())
					}
					return string(out)
				}
			}
			n, err := simnode.Generate(filepath.Join(root, "host"), simnode.Options{NumGPUs: 2, DeviceNodes: true, Arch: arch})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "config.yaml"), []byte("hostRoot: /host\ndriverRoot: /host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if got, want := strings.TrimSpace(run("version")), "nri-gpu "+m.version; got != want {
				t.Errorf("nri-gpu version in the image: %q, want %q", got, want)
			}

			var inv struct {
				DriverVersion string `json:"driverVersion"`
				NVML          string `json:"nvml"`
				GPUs          []struct {
					UUID string `json:"uuid"`
				} `json:"gpus"`
			}
			if err := json.Unmarshal([]byte(run("inventory", "-config", "/config.yaml", "-o", "json")), &inv); err != nil {
				t.Fatal(err)
			}
			var uuids []string
			for _, g := range inv.GPUs {
				uuids = append(uuids, g.UUID)
			}
			want := []string{n.GPUs[0].UUID, n.GPUs[1].UUID}
			if d := cmp.Diff(want, uuids); d != "" || inv.DriverVersion != n.DriverVersion {
				t.Errorf("inventory in the image: driver %q (want %q), GPUs (-want +got):\n%s", inv.DriverVersion, n.DriverVersion, d)
			}
			if inv.NVML != "ok" {
				t.Errorf("NVML in the image: %q, want ok (the simulated libnvidia-ml.so.1 loaded with the image's glibc)", inv.NVML)
			}
		})
	}
}
