package discover_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestDiscoverHostileNode plants what a hostile or broken node could hold
// where discovery reads the kernel's side: a FIFO (which blocks open(2))
// as a GPU's information file and an oversized procfs file. Discovery
// must finish, leave those GPUs out with a warning, and keep the rest.
// TestDiscoverHostileDriverFiles does the same for the driver's files.
func TestDiscoverHostileNode(t *testing.T) {
	n := generateWithNodes(t, simnode.Options{NumGPUs: 3})
	// GPU 0's information file is a FIFO.
	info0 := filepath.Join(n.Root, "proc/driver/nvidia/gpus", n.GPUs[0].BusID, "information")
	must(t, os.Remove(info0))
	must(t, syscall.Mkfifo(info0, 0o644))
	// GPU 1's information file is larger than any real one.
	info1 := filepath.Join(n.Root, "proc/driver/nvidia/gpus", n.GPUs[1].BusID, "information")
	mustWrite(t, info1, strings.Repeat("Model: x\n", 100000))

	s := discoverWithin(t, n.Root)
	if len(s.GPUs) != 1 || s.GPUs[0].UUID != n.GPUs[2].UUID {
		t.Errorf("GPUs %+v, want only the third", s.GPUs)
	}
	if !slices.ContainsFunc(s.Files, func(f inventory.DriverFile) bool { return f.Name == "libcuda.so.1" }) {
		t.Error("libcuda.so.1 missing: the driver must still be found")
	}
	for _, want := range []string{"information: not a regular file (p", "larger than"} {
		if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, want) }) {
			t.Errorf("no warning containing %q in:\n%s", want, strings.Join(s.Warnings, "\n"))
		}
	}
}

// TestDiscoverHostileDriverFiles plants, where discovery reads the
// driver's files, a FIFO as libcuda's real file and directories of
// binaries and firmware that link out of the driver root. Discovery must
// finish, leave those out with a warning, and keep the rest. The node has
// no device nodes: no root needed.
func TestDiscoverHostileDriverFiles(t *testing.T) {
	n := generate(t, simnode.Options{NumGPUs: 1})
	// libcuda's real file is a FIFO.
	lib := filepath.Join(n.Root, n.LibDir)
	real := filepath.Join(lib, "libcuda.so."+n.DriverVersion)
	must(t, os.Remove(real))
	must(t, syscall.Mkfifo(real, 0o644))
	// The binaries' directory and the firmware directory link out of the
	// root.
	must(t, os.RemoveAll(filepath.Join(n.Root, "usr/bin")))
	must(t, os.Symlink("../../../../../../../../../../../../usr/bin", filepath.Join(n.Root, "usr/bin")))
	fw := filepath.Join(n.Root, "usr/lib/firmware/nvidia")
	must(t, os.RemoveAll(fw))
	must(t, os.Symlink("../../../../../../../../../../../../lib/firmware/nvidia", fw))

	s := discoverWithin(t, n.Root)
	for _, f := range s.Files {
		if strings.HasPrefix(f.Name, "libcuda.so") || f.Kind == inventory.Binary || f.Kind == inventory.FirmwareDir || !strings.HasPrefix(f.HostPath, n.Root+"/") {
			t.Errorf("file that should have been refused: %+v", f)
		}
	}
	if !slices.ContainsFunc(s.Files, func(f inventory.DriverFile) bool { return f.Name == "libnvidia-ml.so.1" }) {
		t.Error("libnvidia-ml.so.1 missing: the rest of the driver must still be found")
	}
	for _, want := range []string{"not a regular file (p", "libcuda.so", "skipping /usr/bin/nvidia-smi: path escapes the root", "skipping /usr/lib/firmware/nvidia/" + n.DriverVersion + ": path escapes the root"} {
		if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, want) }) {
			t.Errorf("no warning containing %q in:\n%s", want, strings.Join(s.Warnings, "\n"))
		}
	}
}

// discoverWithin is discover, failing the test if discovery hangs.
func discoverWithin(t *testing.T, root string) *inventory.Snapshot {
	t.Helper()
	done := make(chan *inventory.Snapshot, 1)
	go func() { done <- discoverAt(t, root) }()
	select {
	case s := <-done:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("discovery hangs")
	}
	return nil
}
