package image_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// unpackLayer writes the image's layer into dir, as a runtime's
// snapshotter would.
func unpackLayer(t *testing.T, archivePath, dir string) {
	t.Helper()
	f, err := os.Open(archivePath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if blobs[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
	var idx v1.IndexManifest
	var m v1.Manifest
	if err := json.Unmarshal(blobs["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(blobs["blobs/sha256/"+idx.Manifests[0].Digest.Hex], &m); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blobs["blobs/sha256/"+m.Layers[0].Digest.Hex]))
	if err != nil {
		t.Fatal(err)
	}
	lr := tar.NewReader(zr)
	for {
		h, err := lr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode))
		case tar.TypeReg:
			var data []byte
			if data, err = io.ReadAll(lr); err == nil {
				err = os.WriteFile(p, data, os.FileMode(h.Mode))
			}
		default:
			t.Fatalf("layer entry %s of type %c", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestRunsInImageRoot runs the image's binary in the image's root file
// system alone (chroot: nothing of the build machine's), as the
// DaemonSet's container runs it: it reports the image's version, and
// `nri-gpu inventory` on a simulated node under /host loads the node's
// libnvidia-ml.so.1 (a glibc shared object, built with gcc) with the
// image's loader and libraries. Needs root (chroot, device nodes).
func TestRunsInImageRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chroot into the image's root file system and mknod for the simulated node (CI runs as root)")
	}
	m := testImage(t)
	root := t.TempDir()
	unpackLayer(t, m.tar, root)
	n, err := simnode.Generate(filepath.Join(root, "host"), simnode.Options{NumGPUs: 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config.yaml"), []byte("hostRoot: /host\ndriverRoot: /host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
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
}
