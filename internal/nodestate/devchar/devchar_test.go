package devchar_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/devchar"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// simulated discovers a simulated node of 2 GPUs and 2 IMEX channels
// (real character devices: needs root, as CI is).
func simulated(t *testing.T) (*simnode.Node, *inventory.Snapshot) {
	t.Helper()
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: the nodes are character devices made with mknod: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2, SwapMinors: true, DeviceNodes: true, IMEXChannels: 2, NoDriver: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 2 || len(s.IMEXChannels) != 2 {
		t.Fatalf("discovered %d GPUs, %d channels", len(s.GPUs), len(s.IMEXChannels))
	}
	return n, s
}

func readlink(t *testing.T, root, name string) string {
	t.Helper()
	target, err := os.Readlink(filepath.Join(root, "dev", "char", name))
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return target
}

// TestEnsureAndRemove: every node nri-gpu injects gets its link, which
// resolves to the node; links and files that were there are left alone,
// and Remove takes only the links Ensure made.
func TestEnsureAndRemove(t *testing.T) {
	n, s := simulated(t)
	o := devchar.Options{HostRoot: n.Root, StateDir: filepath.Join(t.TempDir(), "state")}
	nodes := devchar.Nodes(s)
	// 2 GPUs, their 2 DRM nodes each, nvidiactl, nvidia-uvm,
	// nvidia-uvm-tools, nvidia-modeset, 2 channels.
	if len(nodes) != 12 {
		t.Fatalf("nodes %+v", nodes)
	}
	charDir := filepath.Join(n.Root, "dev", "char")
	if err := os.MkdirAll(charDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Foreign: a link to another target at nvidiactl's name, a file at
	// nvidia-modeset's, an unrelated link; udev's link of the first GPU.
	foreign := map[string]string{"195:255": "../somewhere", "10:200": "../net/tun"}
	for name, target := range foreign {
		if err := os.Symlink(target, filepath.Join(charDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(charDir, "195:254"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	g0 := s.GPUs[0].Node
	udev, _ := devchar.LinkFor(g0)
	if err := os.Symlink(udev.Target, filepath.Join(charDir, udev.Name)); err != nil {
		t.Fatal(err)
	}

	res, err := devchar.Ensure(o, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Created) != 9 || res.Present != 1 || len(res.Foreign) != 2 {
		t.Errorf("Ensure: %+v", res)
	}
	for _, nd := range nodes {
		l, _ := devchar.LinkFor(nd)
		if nd.Minor == 255 || nd.Minor == 254 && nd.Major == 195 {
			continue
		}
		// The link resolves, on the host, to the node itself.
		fi, err := os.Stat(filepath.Join(charDir, l.Name))
		if err != nil {
			t.Errorf("%s: %v", l.Path(), err)
			continue
		}
		want, _ := os.Stat(filepath.Join(n.Root, nd.Path))
		if !os.SameFile(fi, want) {
			t.Errorf("%s does not resolve to %s", l.Path(), nd.Path)
		}
	}
	if got := readlink(t, n.Root, "195:255"); got != "../somewhere" {
		t.Errorf("foreign link replaced: %s", got)
	}
	// The DRM nodes, under their own major (226).
	for _, g := range s.GPUs {
		for _, nd := range []inventory.DeviceNode{g.Card(), g.Render()} {
			l, _ := devchar.LinkFor(nd)
			if nd.Path == "" || nd.Major != 226 || readlink(t, n.Root, l.Name) != "../dri/"+filepath.Base(nd.Path) {
				t.Errorf("GPU %d's DRM node %q: /dev/char/%s -> %s", g.Index, nd.Path, l.Name, readlink(t, n.Root, l.Name))
			}
		}
	}
	imex, _ := devchar.LinkFor(s.IMEXChannels[1].Node)
	if got := readlink(t, n.Root, imex.Name); got != "../nvidia-caps-imex-channels/channel1" {
		t.Errorf("IMEX channel 1's link: %s", got)
	}

	// A second Ensure (a rediscovery) makes nothing and keeps the record.
	res, err = devchar.Ensure(o, nodes)
	if err != nil || len(res.Created) != 0 || res.Present != 10 {
		t.Errorf("second Ensure: %+v, %v", res, err)
	}
	rec, err := devchar.Recorded(o)
	if err != nil || len(rec) != 9 {
		t.Errorf("record %v, %v", rec, err)
	}
	if problems, err := devchar.Check(n.Root, nodes); err != nil || len(problems) != 2 {
		t.Errorf("Check: %+v, %v", problems, err)
	}

	// A rediscovery that no longer lists IMEX channel 1 while the host
	// still has its node (a discovery that sees less for a while): the
	// link stays, and stays recorded.
	res, err = devchar.Ensure(o, nodes[:len(nodes)-1])
	if err != nil || len(res.Removed) != 0 {
		t.Errorf("Ensure without a node the host has: %+v, %v", res, err)
	}
	if got := readlink(t, n.Root, imex.Name); got != "../nvidia-caps-imex-channels/channel1" {
		t.Errorf("the link of a node the host still has went: %s", got)
	}
	// The node gone from the host (the driver made fewer channels): its
	// link goes at the next Ensure, whatever it is asked for; the others
	// stay.
	chPath := filepath.Join(n.Root, s.IMEXChannels[1].Node.Path)
	chInfo, _ := os.Lstat(chPath)
	if err := os.Remove(chPath); err != nil {
		t.Fatal(err)
	}
	res, err = devchar.Ensure(o, nodes)
	if err != nil || len(res.Removed) != 1 || res.Removed[0] != imex {
		t.Errorf("Ensure with a node gone: %+v, %v", res, err)
	}
	if got := readlink(t, n.Root, imex.Name); got == "../nvidia-caps-imex-channels/channel1" {
		t.Errorf("the link of a node gone stays")
	}
	if rec, _ := devchar.Recorded(o); len(rec) != 8 {
		t.Errorf("record after the node went: %v", rec)
	}
	st := chInfo.Sys().(*syscall.Stat_t)
	if err := syscall.Mknod(chPath, syscall.S_IFCHR|0o666, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}
	if _, err := devchar.Ensure(o, nodes); err != nil {
		t.Fatal(err)
	}

	// One of ours replaced by the operator: not removed.
	g1, _ := devchar.LinkFor(s.GPUs[1].Node)
	os.Remove(filepath.Join(charDir, g1.Name))
	if err := os.Symlink("/dev/"+g1.Target[3:], filepath.Join(charDir, g1.Name)); err != nil {
		t.Fatal(err)
	}
	removed, err := devchar.Remove(o)
	if err != nil || len(removed) != 8 {
		t.Errorf("Remove: %v, %v", removed, err)
	}
	left, _ := os.ReadDir(charDir)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	want := []string{"10:200", udev.Name, g1.Name, "195:254", "195:255"}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("left in /dev/char: %v, want %v", names, want)
	}
	if _, err := os.Stat(filepath.Join(o.StateDir, devchar.RecordName)); !os.IsNotExist(err) {
		t.Errorf("record left after Remove: %v", err)
	}
}

// TestRecordOfAnotherBoot: links recorded in another boot are not nri-gpu's
// any more (that /dev is gone; a link of the same name now is someone
// else's): Remove leaves them.
func TestRecordOfAnotherBoot(t *testing.T) {
	n, s := simulated(t)
	o := devchar.Options{HostRoot: n.Root, StateDir: t.TempDir()}
	bootFile := filepath.Join(n.Root, "proc", "sys", "kernel", "random", "boot_id")
	if err := os.MkdirAll(filepath.Dir(bootFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bootFile, []byte("boot-1\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := devchar.Ensure(o, devchar.Nodes(s)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bootFile, []byte("boot-2\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	removed, err := devchar.Remove(o)
	if err != nil || len(removed) != 0 {
		t.Errorf("Remove after a reboot: %v, %v", removed, err)
	}
	if problems, _ := devchar.Check(n.Root, devchar.Nodes(s)); len(problems) != 0 {
		t.Errorf("links gone: %+v", problems)
	}
}

// TestNodesMIG: the MIG capability nodes of the snapshot that the host
// has (GPU instance and compute instance access, mig config and monitor)
// are linked like the GPUs; one the host lacks is not (a link to nothing
// would not help runc).
func TestNodesMIG(t *testing.T) {
	n, s := simulated(t)
	st := simnode.MixedMIG()
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	major, err := n.CapsMajor()
	if err != nil {
		t.Fatal(err)
	}
	node := func(minor int) inventory.DeviceNode {
		return inventory.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), Major: int64(major), Minor: int64(minor), Mode: 0o444}
	}
	cfg, mon := node(1), node(2)
	s.MIGControl = inventory.MIGControl{Config: &cfg, Monitor: &mon}
	for i, g := range n.GPUs {
		for j, m := range st.GPUs[i].MIG {
			s.MIG = append(s.MIG, inventory.MIGDevice{
				UUID: simnode.MIGUUIDFor(g.UUID, m.GI, m.CI), Index: j, Parent: i, ParentUUID: g.UUID, GI: m.GI, CI: m.CI,
				GINode: node(simnode.GIMinor(g.Minor, m.GI)), CINode: node(simnode.CIMinor(g.Minor, m.GI, m.CI)),
			})
		}
	}
	// The host lacks GPU 1's last compute instance node.
	last := s.MIG[len(s.MIG)-1].CINode
	if err := os.Remove(filepath.Join(n.Root, last.Path)); err != nil {
		t.Fatal(err)
	}
	nodes := devchar.Nodes(s)
	// 12 as in TestEnsureAndRemove (GPUs, their DRM nodes, control nodes,
	// IMEX channels), 11 GPU instances, 11 compute instances less the one
	// removed, config, monitor.
	if len(nodes) != 12+11+10+2 {
		t.Fatalf("%d nodes: %+v", len(nodes), nodes)
	}
	if slices.Contains(nodes, last) {
		t.Errorf("linked a node the host lacks: %+v", last)
	}
	for _, want := range []inventory.DeviceNode{cfg, mon, s.MIG[0].GINode, s.MIG[0].CINode} {
		if !slices.Contains(nodes, want) {
			t.Errorf("missing %+v", want)
		}
	}
	o := devchar.Options{HostRoot: n.Root, StateDir: t.TempDir()}
	if _, err := devchar.Ensure(o, nodes); err != nil {
		t.Fatal(err)
	}
	l, _ := devchar.LinkFor(s.MIG[0].CINode)
	fi, err := os.Stat(filepath.Join(n.Root, "dev", "char", l.Name))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.Stat(filepath.Join(n.Root, s.MIG[0].CINode.Path))
	if !os.SameFile(fi, want) || l.Target != fmt.Sprintf("../nvidia-caps/nvidia-cap%d", s.MIG[0].CINode.Minor) {
		t.Errorf("%s -> %s does not resolve to %s", l.Path(), l.Target, s.MIG[0].CINode.Path)
	}
}
