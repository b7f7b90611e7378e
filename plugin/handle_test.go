package plugin

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

var layout = adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"}

// benchSnapshot is a node with 8 GPUs and about 40 driver files of every
// capability, built in memory.
func benchSnapshot() *inventory.Snapshot {
	s := &inventory.Snapshot{
		DriverVersion: "580.126.09",
		Control: inventory.ControlNodes{
			Ctl:      &inventory.DeviceNode{Path: "/dev/nvidiactl", Major: 195, Minor: 255, Mode: 0o666},
			UVM:      &inventory.DeviceNode{Path: "/dev/nvidia-uvm", Major: 510, Minor: 0, Mode: 0o666},
			UVMTools: &inventory.DeviceNode{Path: "/dev/nvidia-uvm-tools", Major: 510, Minor: 1, Mode: 0o666},
			Modeset:  &inventory.DeviceNode{Path: "/dev/nvidia-modeset", Major: 195, Minor: 254, Mode: 0o666},
		},
	}
	for i := 0; i < 8; i++ {
		s.GPUs = append(s.GPUs, inventory.GPU{
			Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%08x-558d-fb20-8eca-25de8b98f5a7", i),
			BusID: fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10),
			Node:  inventory.DeviceNode{Path: "/dev/nvidia" + strconv.Itoa(i), Major: 195, Minor: int64(i), Mode: 0o666},
		})
	}
	caps := []inventory.Capability{inventory.Utility, inventory.Compute, inventory.Video, inventory.Graphics, inventory.NGX}
	for i := 0; i < 38; i++ {
		c := caps[i%len(caps)]
		s.Files = append(s.Files, inventory.DriverFile{
			Kind: inventory.Library, Capability: c,
			HostPath: fmt.Sprintf("/usr/lib64/libnvidia-%d.so.580.126.09", i), Name: fmt.Sprintf("libnvidia-%d.so.1", i),
		})
	}
	s.Files = append(s.Files,
		inventory.DriverFile{Kind: inventory.Binary, Capability: inventory.Utility, HostPath: "/usr/bin/nvidia-smi", Name: "nvidia-smi"},
		inventory.DriverFile{Kind: inventory.FirmwareDir, HostPath: "/lib/firmware/nvidia/580.126.09", Name: "580.126.09"},
	)
	return s
}

// tableFor returns an empty allocation table for the GPUs of s.
func tableFor(s *inventory.Snapshot) *alloc.Table {
	var idx []int
	for _, g := range s.GPUs {
		idx = append(idx, g.Index)
	}
	return alloc.New(idx)
}

func TestHandle(t *testing.T) {
	s := benchSnapshot()
	pod := &api.PodSandbox{Annotations: map[string]string{"gpus.nri-gpu.dev/container.a": `"device=1,GPU-00000003-558d-fb20-8eca-25de8b98f5a7",capabilities=all`}}
	adj, res, err := Handle(adjust.Prepare(s, layout), tableFor(s), alloc.Shared, pod, &api.Container{Name: "a", Env: []string{"LD_LIBRARY_PATH=/opt/lib"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(adj.Linux.Devices); got != 2+4 {
		t.Errorf("%d devices, want 2 GPUs and 4 control nodes", got)
	}
	if got := len(adj.Mounts); got != 40 {
		t.Errorf("%d mounts, want 40", got)
	}
	env := map[string]string{}
	for _, e := range adj.Env {
		env[e.Key] = e.Value
	}
	if got, want := adj.Annotations[alloc.Annotation], `{"mode":"shared","gpus":["GPU-00000001-558d-fb20-8eca-25de8b98f5a7","GPU-00000003-558d-fb20-8eca-25de8b98f5a7"]}`; got != want {
		t.Errorf("allocation annotation %s, want %s", got, want)
	}
	if env["NVIDIA_VISIBLE_DEVICES"] != "GPU-00000001-558d-fb20-8eca-25de8b98f5a7,GPU-00000003-558d-fb20-8eca-25de8b98f5a7" ||
		env["LD_LIBRARY_PATH"] != "/opt/lib:/usr/local/nvidia/lib64" || len(env) != 2 {
		t.Errorf("env = %v", env)
	}
	if res.Edits.Files != 40 || res.Selection.Caps != inventory.AllCapabilities {
		t.Errorf("result = %+v", res)
	}

	// A container of another name in the same pod is left alone; so is
	// a failed request.
	if adj, _, err := Handle(adjust.Prepare(s, layout), tableFor(s), alloc.Shared, pod, &api.Container{Name: "b"}); adj != nil || err != nil {
		t.Errorf("other container: %v, %v", adj, err)
	}
	bad := &api.PodSandbox{Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "device=8"}}
	if adj, _, err := Handle(adjust.Prepare(s, layout), tableFor(s), alloc.Shared, bad, &api.Container{Name: "b"}); adj != nil || err == nil {
		t.Errorf("bad request: %v, %v", adj, err)
	}
}

// BenchmarkHandle measures the whole request path (parse, select, edits,
// adjustment) for all 8 GPUs with every capability, about 40 files.
func BenchmarkHandle(b *testing.B) {
	s := benchSnapshot()
	pod := &api.PodSandbox{Name: "p", Namespace: "default", Annotations: map[string]string{
		"gpus.nri-gpu.dev/container.train": "all,capabilities=all",
	}}
	ctr := &api.Container{Name: "train", Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}}
	prep := adjust.Prepare(s, layout)
	table := tableFor(s)
	b.ReportAllocs()
	for b.Loop() {
		adj, _, err := Handle(prep, table, alloc.Shared, pod, ctr)
		if err != nil || len(adj.Mounts) != 40 {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandleEnv is the same through NVIDIA_VISIBLE_DEVICES with the
// default capabilities.
func BenchmarkHandleEnv(b *testing.B) {
	s := benchSnapshot()
	pod := &api.PodSandbox{Name: "p", Namespace: "default"}
	ctr := &api.Container{Name: "train", Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"}}
	prep := adjust.Prepare(s, layout)
	table := tableFor(s)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Handle(prep, table, alloc.Shared, pod, ctr); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRequestPathImportsNoIO checks that the packages of the request path
// cannot touch the file system or the network: none of them imports a
// package that could.
func TestRequestPathImportsNoIO(t *testing.T) {
	forbidden := []string{"os", "io/fs", "io/ioutil", "syscall", "net", "os/exec", "golang.org/x/sys/unix", "path/filepath"}
	for _, dir := range []string{"../request", "../alloc", "../adjust"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no files in %s: %v", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				for _, bad := range forbidden {
					if p == bad {
						t.Errorf("%s imports %s: the request path must not do I/O", f, p)
					}
				}
			}
		}
	}
	if _, err := os.Stat("../request"); err != nil {
		t.Fatal(err)
	}
}
