package suite

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// devCharState is what a node's simulated host has of nri-gpu's /dev/char
// links: every entry of /dev/char (name: link target) and the record of
// the links nri-gpu made, in its library cache's directory.
type devCharState struct {
	links     map[string]string
	record    map[string]string // nil when there is no record
	recordRaw string
}

// Paths on a node (as the node sees them) of its simulated host's
// /dev/char and of the record (the DaemonSet's library-cache volume:
// driverRoot + /var/lib/nri-gpu, at devCharLinks.stateDir in the pod).
const (
	nodeDevChar    = harness.NodeDriverRoot + "/dev/char"
	nodeStateDir   = harness.NodeDriverRoot + "/var/lib/nri-gpu"
	nodeRecordFile = nodeStateDir + "/devchar-links.json"
)

func readDevChar(k kc, n *harness.Node) devCharState {
	k.t.Helper()
	st := devCharState{links: map[string]string{}}
	entries, err := os.ReadDir(n.HostPath(nodeDevChar))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		k.t.Fatal(err)
	}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(n.HostPath(nodeDevChar), e.Name()))
		if err != nil {
			target = "(not a link)"
		}
		st.links[e.Name()] = target
	}
	data, err := os.ReadFile(n.HostPath(nodeRecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st
	}
	if err != nil {
		k.t.Fatal(err)
	}
	var rec struct {
		BootID string `json:"bootID"`
		Links  []struct {
			Name   string `json:"name"`
			Target string `json:"target"`
		} `json:"links"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		k.t.Fatalf("node %s: %s: %v\n%s", n.Name, nodeRecordFile, err, data)
	}
	st.recordRaw = string(data)
	st.record = map[string]string{}
	for _, l := range rec.Links {
		st.record[l.Name] = l.Target
	}
	return st
}

// checkLinksStay checks on every node, after an uninstall, that the
// /dev/char links nri-gpu made are still there and its record lists
// exactly them (the simulated host has no link of its own).
func checkLinksStay(k kc) {
	k.t.Helper()
	for _, n := range k.c.Nodes {
		st := readDevChar(k, n)
		switch {
		case len(st.links) == 0:
			k.t.Errorf("node %s: no /dev/char link left after the uninstall", n.Name)
		case st.record == nil:
			k.t.Errorf("node %s: /dev/char links %v but no record %s", n.Name, st.links, nodeRecordFile)
		default:
			if d := cmp.Diff(st.links, st.record); d != "" {
				k.t.Errorf("node %s: /dev/char (-) and nri-gpu's record (+) differ:\n%s", n.Name, d)
			} else {
				k.t.Logf("node %s after the uninstall: %d /dev/char links, all in nri-gpu's record", n.Name, len(st.links))
			}
		}
	}
}

// testUninstall uninstalls the chart with GPU pods running: they keep
// running with their GPUs, the device plugin socket goes, the /dev/char
// links stay. Then, with the GPU pods gone, testCleanup removes the links
// as docs/install.md says.
func testUninstall(k kc) {
	t := k.t
	k.doc("uninstall", nil)
	k.wait(2*time.Minute, "nri-gpu's pods gone", func() (bool, string, error) {
		pods, err := k.c.ListPods(k.ctx, "nri-gpu", "")
		return err == nil && len(pods) == 0, fmt.Sprint(len(pods), err), nil
	})
	pods := runningPods(k, "ml", "app=gpu2", 1)
	v := viewGPUPod(k, pods[0])
	checkSeesExactly(k, v, 2)
	for _, n := range k.c.Nodes {
		sock := n.HostPath(harness.DevicePluginDir + "/nri-gpu-nvidia.com-gpu.sock")
		if _, err := os.Lstat(sock); err == nil {
			t.Errorf("node %s: %s left after uninstall", n.Name, sock)
		}
	}
	checkLinksStay(k)
	k.run("delete", "namespace", "ml", "--wait=true", "--timeout=2m")
	testCleanup(k)
}

// testCleanup removes the /dev/char links after the uninstall as
// docs/install.md tells an operator to, on each node in its mount
// namespace: nri-gpu cleanup (--dry-run, then for real) on gpu-a, the
// doc's shell command on gpu-b. Before it, a link udev would make
// (1:3 -> ../null) and a recorded link replaced since (an absolute
// target) are put there: both must stay, every other recorded link must
// go, and the record; the library cache stays.
func testCleanup(k kc) {
	t := k.t
	for _, n := range k.c.Nodes {
		before := readDevChar(k, n)
		if len(before.record) == 0 {
			t.Errorf("node %s: no record of /dev/char links to clean up", n.Name)
			continue
		}
		dir := n.HostPath(nodeDevChar)
		names := make([]string, 0, len(before.record))
		for name := range before.record {
			names = append(names, name)
		}
		sort.Strings(names)
		replaced := names[0]
		absolute := "/dev/" + strings.TrimPrefix(before.record[replaced], "../")
		if err := os.Remove(filepath.Join(dir, replaced)); err != nil {
			t.Fatal(err)
		}
		for name, target := range map[string]string{"1:3": "../null", replaced: absolute} {
			if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		// What must go: the record's links but the replaced one, as
		// nri-gpu cleanup prints them (under hostRoot).
		var want []string
		for _, name := range names[1:] {
			want = append(want, fmt.Sprintf("%s/%s -> %s", nodeDevChar, name, before.record[name]))
		}
		switch n.Name {
		case "gpu-a":
			cleanupWithBinary(k, n, want)
		default:
			cleanupWithShell(k, n)
		}
		after := readDevChar(k, n)
		if d := cmp.Diff(map[string]string{"1:3": "../null", replaced: absolute}, after.links); d != "" {
			t.Errorf("node %s: /dev/char after the cleanup (-want +got):\n%s", n.Name, d)
		}
		if after.record != nil {
			t.Errorf("node %s: the record is still there after the cleanup:\n%s", n.Name, after.recordRaw)
		}
		if _, err := os.Stat(n.HostPath(nodeStateDir)); err != nil {
			t.Errorf("node %s: the library cache went with the cleanup: %v", n.Name, err)
		}
		t.Logf("node %s: cleanup removed %d recorded links; kept 1:3 -> ../null and %s -> %s", n.Name, len(want), replaced, absolute)
	}
}

// cleanupWithBinary runs docs/install.md's nri-gpu cleanup commands in
// node n's mount namespace with the checkout's bin/nri-gpu and a
// configuration of the simulated host's paths: --dry-run lists want and
// changes nothing, then the cleanup removes want.
func cleanupWithBinary(k kc, n *harness.Node, want []string) {
	t := k.t
	t.Helper()
	if out, err := exec.CommandContext(k.ctx, "make", "-s", "--no-print-directory", "-C", repoRoot(), "build").CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	bin := filepath.Join(repoRoot(), "bin", "nri-gpu")
	config := "/run/nri-gpu-cleanup.yaml" // in the node's own /run
	if err := os.WriteFile(n.HostPath(config), []byte("hostRoot: "+harness.NodeDriverRoot+"\ndevCharLinks:\n  stateDir: "+nodeStateDir+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name, verb string) {
		argv := cleanupCommand(name, bin, config)
		out, err := n.NS.NS.Command(k.ctx, argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("node %s: %s: %v\n%s", n.Name, strings.Join(argv, " "), err, out)
		}
		t.Logf("node %s: %s:\n%s", n.Name, strings.Join(argv, " "), out)
		var got []string
		for l := range strings.Lines(string(out)) {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(l), verb+" "+nodeDevChar+"/"); ok {
				got = append(got, nodeDevChar+"/"+rest)
			}
		}
		sort.Strings(got)
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("node %s: %s: what it says it %s (-want +got):\n%s", n.Name, strings.Join(argv, " "), verb, d)
		}
	}
	before := readDevChar(k, n)
	run("cleanup-dry-run", "would remove")
	if after := readDevChar(k, n); !cmp.Equal(before, after, cmp.AllowUnexported(devCharState{})) {
		t.Errorf("node %s: nri-gpu cleanup --dry-run changed /dev/char or the record:\nbefore %+v\nafter  %+v", n.Name, before, after)
	}
	run("cleanup", "removed")
}

// cleanupWithShell runs docs/install.md's shell command for a node
// without the binary in node n's mount namespace, its paths moved to the
// simulated host (/var/lib/nri-gpu and /dev/char under NodeDriverRoot;
// /proc is the node's own, whose boot id the simulated host has).
func cleanupWithShell(k kc, n *harness.Node) {
	t := k.t
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	const first = "r=/var/lib/nri-gpu/devchar-links.json\n"
	_, rest, ok := strings.Cut(string(data), "```sh\n"+first)
	script, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatalf("docs/install.md: no shell block starting %q", first)
	}
	script = first + script
	moved := strings.NewReplacer("/var/lib/nri-gpu/", nodeStateDir+"/", "/dev/char/", nodeDevChar+"/").Replace(script)
	if strings.Count(moved, harness.NodeDriverRoot) != strings.Count(script, "/var/lib/nri-gpu/")+strings.Count(script, "/dev/char/") ||
		!strings.Contains(moved, nodeDevChar+"/") {
		t.Fatalf("docs/install.md's shell command: paths not moved to the simulated host:\n%s", moved)
	}
	// As an operator pastes it: sh without -e (the loop's last test may
	// fail and must not stop the record's removal).
	out, err := n.NS.NS.Command(k.ctx, "sh", "-c", moved).CombinedOutput()
	if err != nil {
		t.Fatalf("node %s: docs/install.md's shell command: %v\n%s\n--- script ---\n%s", n.Name, err, out, moved)
	}
	t.Logf("node %s: docs/install.md's shell command, paths under %s:\n%s%s", n.Name, harness.NodeDriverRoot, moved, out)
}
