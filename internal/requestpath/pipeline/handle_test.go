package pipeline

import (
	"context"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

var layout = adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"}

// benchSnapshot is the in-memory node of 8 GPUs and 40 driver files.
func benchSnapshot() *inventory.Snapshot { return simnode.MemorySnapshot() }

// tableFor returns an empty allocation table for the GPUs of s.
func tableFor(s *inventory.Snapshot) *alloc.Table { return simnode.TableFor(s) }

// handleWithPolicy runs the request path of src's node under pol.
func handleWithPolicy(src adjust.Source, table *alloc.Table, mode sharing.Mode, pol policy.Policy, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, Result, error) {
	p := Path{Source: src, Table: table, Sharing: mode, Policy: pol}
	return p.Handle(context.Background(), pod, ctr)
}

// handle runs the request path with the default policy (every source
// allowed everywhere).
func handle(src adjust.Source, table *alloc.Table, mode sharing.Mode, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, Result, error) {
	return handleWithPolicy(src, table, mode, policy.Policy{}, pod, ctr)
}

// TestHandle: a container annotation naming GPUs with every capability
// gets exactly those GPUs' nodes, the control nodes and every driver file,
// its own LD_LIBRARY_PATH extended, and the booking's record; a container
// of another name in the pod, and a refused request, get nothing.
func TestHandle(t *testing.T) {
	s := benchSnapshot()
	src := adjust.Prepare(s, layout)
	named := &api.PodSandbox{Annotations: map[string]string{"gpus.nri-gpu.dev/container.a": `"device=1,GPU-00000003-558d-fb20-8eca-25de8b98f5a7",capabilities=all`}}
	bad := &api.PodSandbox{Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "device=8"}}
	gpus := []inventory.GPU{s.GPUs[1], s.GPUs[3]}
	for _, tc := range []struct {
		name string
		pod  *api.PodSandbox
		ctr  *api.Container
		want *answer
		// files and caps are the Result's count of driver files and
		// capabilities; err says whether the request is refused.
		files int
		caps  inventory.Capabilities
		err   bool
	}{
		{"named GPUs, every capability", named, &api.Container{Name: "a", Env: []string{"LD_LIBRARY_PATH=/opt/lib"}}, &answer{
			Devices:     []string{"/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"},
			Mounts:      mountsOf(src.Edits(gpus, inventory.AllCapabilities)),
			Env:         map[string]string{"NVIDIA_VISIBLE_DEVICES": uuid(1) + "," + uuid(3), "LD_LIBRARY_PATH": "/opt/lib:/usr/local/nvidia/lib64"},
			Annotations: map[string]string{alloc.Annotation: `{"version":1,"mode":"shared","gpus":["GPU-00000001-558d-fb20-8eca-25de8b98f5a7","GPU-00000003-558d-fb20-8eca-25de8b98f5a7"]}`},
		}, 40, inventory.AllCapabilities, false},
		{"another container of the pod", named, &api.Container{Name: "b"}, nil, 0, 0, false},
		{"a refused request", bad, &api.Container{Name: "b"}, nil, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adj, res, err := handle(src, tableFor(s), sharing.Shared, tc.pod, tc.ctr)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want one: %v", err, tc.err)
			}
			if d := cmp.Diff(tc.want, answerOf(adj)); d != "" {
				t.Errorf("answer (-want +got):\n%s", d)
			}
			if tc.want != nil && len(tc.want.Mounts) != tc.files {
				t.Errorf("the source's edits have %d mounts, want %d driver files", len(tc.want.Mounts), tc.files)
			}
			if res.Edits.Files != tc.files || res.Selection.Caps != tc.caps {
				t.Errorf("result: %d files, capabilities %v; want %d, %v", res.Edits.Files, res.Selection.Caps, tc.files, tc.caps)
			}
		})
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
		adj, _, err := handle(prep, table, sharing.Shared, pod, ctr)
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
		if _, _, err := handle(prep, table, sharing.Shared, pod, ctr); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandleGiven measures the request path of the kinds whose GPUs
// were given (classified from the container's device nodes, claim
// entries and kubelet annotations): a container of the kubelet's
// assignment of two GPUs, one of a claim of two GPUs, and one a device
// plugin gave two GPUs with NVIDIA_VISIBLE_DEVICES, each with the default
// capabilities; booked and released each round.
func BenchmarkHandleGiven(b *testing.B) {
	s := benchSnapshot()
	src := adjust.Prepare(s, layout)
	prep := claims.New([]claims.Device{claimDev(trainClaim, 1, false), claimDev(trainClaim, 3, false)})
	pod := &api.PodSandbox{Id: "p", Name: "p", Namespace: "ml"}
	for _, tc := range []struct {
		name string
		ctr  *api.Container
	}{
		{"kubelet", kubeletContainer("k", uuid(2)+","+uuid(4), []string{"PATH=/bin"}, 2, 4)},
		{"claim", &api.Container{Id: "c", PodSandboxId: "p", Name: "c", Linux: pluginLinux(1, 3), Env: claimEnv(trainClaim, []string{"PATH=/bin"}, 1, 3)}},
		{"runtime", &api.Container{Id: "r", PodSandboxId: "p", Name: "r", Linux: pluginLinux(5, 6), Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=" + uuid(5) + "," + uuid(6)}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			table := tableFor(s)
			hs, _ := ClaimHoldings(src, sharing.Shared, prep)
			if err := table.SyncClaims(hs, ""); err != nil {
				b.Fatal(err)
			}
			p := Path{Source: src, Table: table, Sharing: sharing.Shared, Claims: prep}
			b.ReportAllocs()
			for b.Loop() {
				adj, _, err := p.Handle(context.Background(), pod, tc.ctr)
				if err != nil || len(adj.GetMounts()) == 0 {
					b.Fatal(err)
				}
				table.Release(tc.ctr.Id)
			}
		})
	}
}

// TestRequestPathImportsNoIO checks that the request path cannot touch
// the file system or the network: neither this package nor any package of
// the module that it imports, directly or through others, imports a
// package that does I/O. The module's packages are followed from their
// source; packages of other modules are the NRI protocol and CDI name
// parsing, which the path uses for types and pure functions.
func TestRequestPathImportsNoIO(t *testing.T) {
	const module = "github.com/nri-gpu/nri-gpu"
	forbidden := []string{"os", "io/fs", "io/ioutil", "syscall", "net", "os/exec", "golang.org/x/sys/unix", "path/filepath"}
	seen := map[string]bool{}
	root := filepath.Join("..", "..", "..") // the module's root, from this package's directory
	var visit func(pkg, dir string)
	visit = func(pkg, dir string) {
		if seen[pkg] {
			return
		}
		seen[pkg] = true
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
				if slices.Contains(forbidden, p) {
					t.Errorf("%s imports %s: the request path must not do I/O", f, p)
				}
				if rel, ok := strings.CutPrefix(p, module+"/"); ok {
					visit(p, filepath.Join(root, filepath.FromSlash(rel)))
				}
			}
		}
	}
	visit(module+"/internal/requestpath/pipeline", ".")
	// The path reaches every stage's package; a test that followed
	// nothing would pass without checking.
	for _, want := range []string{"internal/requestpath/request", "internal/nodestate/policy", "internal/requestpath/alloc", "adjust", "inventory/require", "inventory"} {
		if !seen[module+"/"+want] {
			t.Errorf("the request path does not import %s: the test no longer follows it", want)
		}
	}
}
