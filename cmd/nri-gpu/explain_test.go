package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// explainNode is a simulated 4-GPU node with device nodes (root) and a
// closed configuration that lets namespace ml ask by annotation.
func explainNode(t *testing.T) (*simnode.Node, string) {
	t.Helper()
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: explain discovers a node with real device nodes (mknod): %v", err)
	}
	dir := t.TempDir()
	n, err := simnode.Generate(filepath.Join(dir, "node"), simnode.Options{NumGPUs: 4, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	data := "hostRoot: " + n.Root + "\ndriverRoot: " + n.Root + "\npolicy:\n  default: deny\n  visibleDevices: deny\n  annotationNamespaces: [ml]\n"
	if err := os.WriteFile(cfg, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return n, cfg
}

// TestExplainPod: nri-gpu explain -f of a Pod manifest answers for each
// container in the kubelet's order: an init container that asks for
// nothing, a main container whose annotation the policy allows (its GPUs,
// device nodes, mounts, env), a sidecar whose NVIDIA_VISIBLE_DEVICES the
// policy voids, and a note for what it cannot simulate (a device plugin's
// resources.limits); an over-request is refused with the request path's
// error.
func TestExplainPod(t *testing.T) {
	n, cfg := explainNode(t)
	pod := filepath.Join(t.TempDir(), "pod.yaml")
	os.WriteFile(pod, []byte(`apiVersion: v1
kind: Pod
metadata:
  name: train
  namespace: ml
  annotations: {gpus.nri-gpu.dev/container.main: '"device=0,2"'}
spec:
  initContainers:
  - {name: setup, image: x}
  containers:
  - name: main
    image: x
    env: [{name: PATH, value: /usr/bin:/bin}]
    resources: {limits: {nvidia.com/gpu: 1}}
  - name: sidecar
    image: x
    env: [{name: NVIDIA_VISIBLE_DEVICES, value: "0"}]
`), 0o644)
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"explain", "--config", cfg, "-f", pod, "-o", "json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
	var out Explained
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v:\n%s", err, stdout.String())
	}
	if out.Pod != "ml/train" || len(out.Containers) != 3 {
		t.Fatalf("%+v", out)
	}
	setup, main, sidecar := out.Containers[0], out.Containers[1], out.Containers[2]
	if setup.Name != "setup" || !setup.Init || setup.Outcome != "untouched" || setup.Kind != "none" {
		t.Errorf("setup: %+v", setup)
	}
	if main.Outcome != "injected" || main.Kind != "ownRequest" || main.Source != "annotation gpus.nri-gpu.dev/container.main" ||
		main.Policy != "policy.annotationNamespaces: [ml]" || len(main.GPUs) != 2 || main.GPUs[0].UUID != n.GPUs[0].UUID || main.GPUs[1].UUID != n.GPUs[2].UUID ||
		len(main.Unsimulated) != 1 || !strings.Contains(main.Unsimulated[0], "resources.limits nvidia.com/gpu: 1") {
		t.Errorf("main: %+v", main)
	}
	env := map[string]string{}
	for _, e := range main.Adjustment.GetEnv() {
		env[e.GetKey()] = e.GetValue()
	}
	if env["NVIDIA_VISIBLE_DEVICES"] != n.GPUs[0].UUID+","+n.GPUs[2].UUID || env["PATH"] != "/usr/bin:/bin:/usr/local/nvidia/bin" || len(main.Adjustment.GetLinux().GetDevices()) != 5 {
		t.Errorf("main's adjustment: env %v, %d devices", env, len(main.Adjustment.GetLinux().GetDevices()))
	}
	if sidecar.Outcome != "voided" || sidecar.Policy != "policy.visibleDevices: deny" || !strings.Contains(sidecar.Note, `not allowed in namespace "ml"`) {
		t.Errorf("sidecar: %+v", sidecar)
	}

	stdout.Reset()
	if code := Main([]string{"explain", "--config", cfg, "--namespace", "ml", "--annotation", "gpus.nri-gpu.dev/pod=9"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
	for _, want := range []string{"pod ml/explain", "container main: refused", "refused:      nri-gpu: annotation gpus.nri-gpu.dev/pod: count 9 exceeds the node's 4 GPUs (0-3)"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	// explain makes no /dev/char link (nri-gpu run does).
	if _, err := os.Stat(n.HostPath("run/nri-gpu")); err == nil {
		t.Error("explain recorded /dev/char links")
	}
}

type fixedStatus status.Status

func (f fixedStatus) Status() status.Status { return status.Status(f) }

// TestExplainLiveTable: with --status-socket, explain starts from the
// running plugin's table: a count gets the GPUs that are free there.
func TestExplainLiveTable(t *testing.T) {
	_, cfg := explainNode(t)
	held := alloc.HolderState{Holder: alloc.Holder{ID: "c1", Namespace: "ml", Pod: "big", Container: "main"}, Mode: "exclusive"}
	st := fixedStatus{Ready: true, Sharing: "shared", GPUs: []status.GPUStatus{
		{GPUState: alloc.GPUState{Index: 0, Mode: "exclusive", Holders: []alloc.HolderState{held}}},
		{GPUState: alloc.GPUState{Index: 1, Mode: "exclusive", Holders: []alloc.HolderState{held}}},
		{GPUState: alloc.GPUState{Index: 2, Mode: "free", Holders: []alloc.HolderState{}}},
		{GPUState: alloc.GPUState{Index: 3, Mode: "free", Holders: []alloc.HolderState{}}},
	}}
	dir, err := os.MkdirTemp("", "nri-ex-") // short: socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "status.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := logrus.New()
	log.SetOutput(io.Discard)
	if err := status.Serve(ctx, sock, st, log); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"0", "1"}},
		{[]string{"--status-socket", sock}, []string{"2", "3"}},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"explain", "--config", cfg, "--namespace", "ml", "--annotation", "gpus.nri-gpu.dev/pod=2", "-o", "json"}, tc.args...)
		if code := Main(args, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d:\n%s", code, stderr.String())
		}
		var out Explained
		json.Unmarshal(stdout.Bytes(), &out)
		var got []string
		for _, g := range out.Containers[0].GPUs {
			got = append(got, g.Name)
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%v: GPUs %v, want %v", tc.args, got, tc.want)
		}
	}
}

// TestExplainBadInput: a manifest that is no Pod, a bad flag.
func TestExplainBadInput(t *testing.T) {
	dir := t.TempDir()
	dep := filepath.Join(dir, "dep.yaml")
	os.WriteFile(dep, []byte("apiVersion: apps/v1\nkind: Deployment\n"), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-f", dep}, 1, `kind "Deployment", want a Pod manifest`},
		{[]string{"-f", filepath.Join(dir, "absent.yaml")}, 1, "absent.yaml"},
		{[]string{"--annotation", "novalue"}, 2, `"novalue" is not K=V`},
		{[]string{"-o", "yaml"}, 2, `unknown format "yaml"`},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(append([]string{"explain"}, tc.args...), &stdout, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, want %d with %q:\n%s", tc.args, code, tc.code, tc.want, stderr.String())
		}
	}
}

// TestConfigValidate: nri-gpu config validate parses and validates as run
// does, without discovery: exit 0 for a valid file; 1 with FILE:LINE and
// the key for a bad one; 2 for a bad command line.
func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(data), 0o644)
		return p
	}
	good := write("good.yaml", "hostRoot: /does/not/matter\npolicy:\n  default: deny\n")
	bad := write("bad.yaml", "hostRoot: /\npolicy:\n  default: deny\n  envnamespaces: [a]\n")
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{good}, 0, good + ": valid"},
		{[]string{bad}, 1, bad + `:4: key policy: unknown field "envnamespaces": keys are case-sensitive, did you mean "envNamespaces"?`},
		{[]string{filepath.Join(dir, "absent.yaml")}, 1, "absent.yaml: no such file"},
		{nil, 2, "usage: nri-gpu config validate FILE"},
		{[]string{good, bad}, 2, "usage: nri-gpu config validate FILE"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(append([]string{"config", "validate"}, tc.args...), &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("%v: exit %d, want %d with %q:\n%s%s", tc.args, code, tc.code, tc.out, stdout.String(), stderr.String())
		}
	}
}
