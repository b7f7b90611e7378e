package integration

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// explainCase is one container asked about: explain first, then the
// running plugin over NRI.
type explainCase struct {
	name, ns string
	ann      map[string]string
	env      []string
}

// TestExplainAnswersAsThePlugin: for a table of pods, `nri-gpu explain`
// (against the running plugin's table, --status-socket) gives the answer
// the running plugin then gives over NRI: the same adjustment (device
// nodes, mounts, environment, the allocation record) or the same error,
// the same GPUs picked for a count. Each container is created after it is
// explained, so that the table moves as on a node, and later counts
// depend on earlier bookings.
func TestExplainAnswersAsThePlugin(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	_, cfg := simNode(t, dir, simnode.LayoutDebian,
		"policy:\n  default: deny\n  annotationNamespaces: [ml]\n  visibleDevices: namespaces\n  envNamespaces: [open]\n")
	r := startRuntime(t, dir)
	defer r.stop()
	sock := filepath.Join(dir, "status.sock")
	startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--status-socket", sock)
	select {
	case <-r.synced:
	case <-time.After(20 * time.Second):
		t.Fatal("the plugin did not connect")
	}
	waitReady(t, sock)

	path := "PATH=/usr/bin:/bin"
	for _, tc := range []explainCase{
		{"named", "ml", map[string]string{"gpus.nri-gpu.dev/container.named": `"device=0,2"`}, []string{path}},
		{"count", "ml", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, []string{path}},
		{"exclusive", "ml", map[string]string{"gpus.nri-gpu.dev/pod": "exclusive=true,count=1"}, []string{path}},
		{"count-after", "ml", map[string]string{"gpus.nri-gpu.dev/pod": "2"}, []string{path}},
		{"utility", "open", nil, []string{path, "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"}},
		{"driver-only", "open", nil, []string{path, "NVIDIA_VISIBLE_DEVICES=none"}},
		{"voided", "tenant", nil, []string{path, "NVIDIA_VISIBLE_DEVICES=0"}},
		{"closed-annotation", "tenant", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, []string{path}},
		{"over-request", "ml", map[string]string{"gpus.nri-gpu.dev/pod": "9"}, []string{path}},
		{"bad-token", "ml", map[string]string{"gpus.nri-gpu.dev/container.bad-token": "device=bogus"}, []string{path}},
		{"ALL", "open", nil, []string{path, "NVIDIA_VISIBLE_DEVICES=ALL"}},
		{"plain", "tenant", nil, []string{path}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := explainOne(t, cfg, sock, tc)
			pod := &api.PodSandbox{Id: "pod-" + tc.name, Name: "pod-" + tc.name, Namespace: tc.ns, Uid: "uid-" + tc.name, Annotations: tc.ann}
			ctr := &api.Container{Id: "ctr-" + tc.name, PodSandboxId: pod.Id, Name: tc.name, Env: tc.env}
			rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
			switch {
			case want.Error != "":
				if err == nil || !strings.Contains(err.Error(), want.Error) {
					t.Errorf("explain: refused with %q; the plugin: %v", want.Error, err)
				}
			case err != nil:
				t.Errorf("explain: %s; the plugin refused: %v", want.Outcome, err)
			default:
				// What the container gets: each adjustment applied to
				// the same spec, as containerd applies it (the runtime
				// side fills empty fields of its own in the reply).
				explained, served := applyToSpec(t, want.Adjustment), applyToSpec(t, rpl.GetAdjust())
				if diff := cmp.Diff(explained, served); diff != "" {
					t.Errorf("the container as explained (-) and as served (+) differ:\n%s", diff)
				}
				if len(served.Process.Env) == 1 && tc.name != "plain" {
					t.Errorf("the plugin changed nothing: %v", served.Process.Env)
				}
			}
			t.Logf("%s: %s %s %s", tc.name, want.Outcome, want.Kind, want.Error)
		})
	}
}

// explainedContainer is the part of explain's JSON answer for one
// container that the test compares.
type explainedContainer struct {
	Outcome    string                   `json:"outcome"`
	Kind       string                   `json:"kind"`
	Error      string                   `json:"error"`
	Adjustment *api.ContainerAdjustment `json:"adjustment"`
}

// explainOne runs nri-gpu explain for tc's container against the running
// plugin's table and returns its answer.
func explainOne(t *testing.T, cfg, sock string, tc explainCase) explainedContainer {
	t.Helper()
	args := []string{"explain", "--config", cfg, "--status-socket", sock, "--namespace", tc.ns, "--pod", "pod-" + tc.name, "--container", tc.name, "-o", "json"}
	keys := make([]string, 0, len(tc.ann))
	for k := range tc.ann {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "--annotation", k+"="+tc.ann[k])
	}
	for _, e := range tc.env {
		args = append(args, "--env", e)
	}
	out, err := exec.Command(binary, args...).Output()
	if err != nil {
		t.Fatalf("nri-gpu %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var e struct {
		Containers []explainedContainer `json:"containers"`
	}
	if err := json.Unmarshal(out, &e); err != nil || len(e.Containers) != 1 {
		t.Fatalf("explain's answer: %v\n%s", err, out)
	}
	return e.Containers[0]
}

// waitReady waits until the plugin on sock says it is ready.
func waitReady(t *testing.T, sock string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := exec.Command(binary, "status", "--ready", "--status-socket", sock).CombinedOutput()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin is not ready: %v\n%s", err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
