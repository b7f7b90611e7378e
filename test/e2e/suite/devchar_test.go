package suite

import (
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	_ "github.com/opencontainers/cgroups/devices" // sets systemd.GenerateDeviceProps: runc's translation
	devconfig "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/cgroups/systemd"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestDevCharLinks: nri-gpu run makes the /dev/char links of the nodes it
// injects when it starts, they stay when it stops (the container keeps
// running) and nri-gpu cleanup removes them; and what that means for
// runc's systemd cgroup driver. A container is created on a
// real containerd; the device rules of its OCI spec (what nri-gpu's
// answer became) are fed into runc's translation to systemd properties
// (github.com/opencontainers/cgroups/devices, as runc v1.5.3 vendors it)
// with /dev bound to the simulated node's /dev in a private mount
// namespace of the test's thread, with and without the links:
//
//   - for systemd before v240, runc emits DeviceAllow=/dev/char/<M>:<m>
//     only where that path exists: without the links the GPUs' entries are
//     left out, and a daemon-reload rewrites the container's device cgroup
//     without them;
//   - for systemd v240 and later, runc emits every entry whatever the
//     links (systemd reads the numbers from the path).
//
// No systemd runs as PID 1 here: what systemd then does with the entries
// is not exercised.
func TestDevCharLinks(t *testing.T) {
	w := imexWorld(t, "")
	sn := w.node.Node
	charDir := sn.HostPath("/dev/char")
	g := sn.GPUs[0]
	imexMajor := simnode.IMEXMajor(sn.UVMMajor)
	// The nodes nri-gpu gives the container below: the GPU, nvidiactl,
	// nvidia-uvm, nvidia-uvm-tools (compute), IMEX channel 1.
	ours := []string{
		fmt.Sprintf("/dev/char/195:%d", g.Minor), "/dev/char/195:255",
		fmt.Sprintf("/dev/char/%d:0", sn.UVMMajor), fmt.Sprintf("/dev/char/%d:1", sn.UVMMajor),
		fmt.Sprintf("/dev/char/%d:1", imexMajor),
	}
	for _, p := range ours {
		target, err := os.Readlink(sn.HostPath(p))
		if err != nil {
			t.Fatalf("nri-gpu run made no %s: %v\n%s", p, err, w.plugin.log.String())
		}
		if _, err := os.Stat(sn.HostPath(p)); err != nil {
			t.Errorf("%s -> %s does not resolve: %v", p, target, err)
		}
	}

	c, err := w.runIn("default", "devchar", nil, harness.ContainerSpec{Env: map[string]string{
		"NVIDIA_VISIBLE_DEVICES": g.UUID, "NVIDIA_IMEX_CHANNELS": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	rules := specRules(t, w, c.id)

	with239, with255 := deviceAllow(t, sn.HostPath("/dev"), rules)
	for _, p := range ours {
		if !slices.Contains(with239, p) || !slices.Contains(with255, p) {
			t.Errorf("with the links: DeviceAllow lacks %s (systemd 239: %q; 255: %q)", p, with239, with255)
		}
	}

	// nri-gpu stops (SIGTERM, as at a rolling update or an uninstall)
	// while the container runs: its links stay, so that the container
	// keeps its GPU through a daemon-reload.
	before, _ := os.ReadDir(charDir)
	if err := w.plugin.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.plugin.done:
	case <-time.After(20 * time.Second):
		t.Fatal("nri-gpu did not stop on SIGTERM")
	}
	after, _ := os.ReadDir(charDir)
	t.Logf("/dev/char links: %d before nri-gpu stopped, %d after", len(before), len(after))
	if len(after) != len(before) {
		t.Errorf("links lost when nri-gpu stopped: %d of %d left\n%s", len(after), len(before), w.plugin.log.String())
	}
	kept239, _ := deviceAllow(t, sn.HostPath("/dev"), rules)
	for _, p := range ours {
		if !slices.Contains(kept239, p) {
			t.Errorf("after nri-gpu stopped, systemd 239: DeviceAllow lacks %s", p)
		}
	}

	// The uninstall's cleanup removes them.
	out, err := exec.Command(nriGPU(t), "cleanup", "--config", w.node.config).CombinedOutput()
	if err != nil {
		t.Fatalf("nri-gpu cleanup: %v\n%s", err, out)
	}
	if left, _ := os.ReadDir(charDir); len(left) != 0 {
		t.Errorf("links left after nri-gpu cleanup: %v\n%s", left, out)
	}

	without239, without255 := deviceAllow(t, sn.HostPath("/dev"), rules)
	for _, p := range ours {
		if slices.Contains(without239, p) {
			t.Errorf("without the links, systemd 239: DeviceAllow has %s", p)
		}
		if !slices.Contains(without255, p) {
			t.Errorf("without the links, systemd 255: DeviceAllow lacks %s", p)
		}
	}
	t.Logf("DeviceAllow for systemd 239 with the links: %q", with239)
	t.Logf("DeviceAllow for systemd 239 without them (after nri-gpu cleanup):  %q", without239)
}

// specRules returns the device cgroup rules of the container's OCI spec,
// as the runtime hands it to runc, in runc's form.
func specRules(t *testing.T, w *world, id string) []*devconfig.Rule {
	t.Helper()
	spec, err := w.cri.RuntimeSpec(w.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var rules []*devconfig.Rule
	for _, d := range spec.Linux.Resources.Devices {
		r := &devconfig.Rule{Type: devconfig.Type('a'), Major: devconfig.Wildcard, Minor: devconfig.Wildcard,
			Permissions: devconfig.Permissions(d.Access), Allow: d.Allow}
		if d.Type != "" {
			r.Type = devconfig.Type(d.Type[0])
		}
		if d.Major != nil {
			r.Major = *d.Major
		}
		if d.Minor != nil {
			r.Minor = *d.Minor
		}
		rules = append(rules, r)
	}
	if len(rules) == 0 {
		t.Fatalf("no device rules in the spec of %s", id)
	}
	return rules
}

// deviceAllow runs runc's translation of rules to systemd properties for
// systemd 239 and 255, with devDir as /dev, and returns the paths of the
// DeviceAllow entries of each.
func deviceAllow(t *testing.T, devDir string, rules []*devconfig.Rule) (sd239, sd255 []string) {
	t.Helper()
	type result struct {
		sd239, sd255 []string
		err          error
	}
	done := make(chan result, 1)
	go func() {
		// This thread alone enters a private mount namespace, and goes
		// back to the process's before it ends: it is never unlocked,
		// so it ends with the goroutine, unless it is the runtime's main
		// thread, which Go keeps (wedged) instead, and whose namespace
		// is what /proc/self shows every later test.
		runtime.LockOSThread()
		var r result
		defer func() { done <- r }()
		host, err := os.Open("/proc/thread-self/ns/mnt")
		if err != nil {
			r.err = err
			return
		}
		defer host.Close()
		if r.err = unix.Unshare(unix.CLONE_NEWNS); r.err != nil {
			return
		}
		defer func() {
			if err := unix.Setns(int(host.Fd()), unix.CLONE_NEWNS); err != nil && r.err == nil {
				r.err = fmt.Errorf("back to the process's mount namespace: %w", err)
			}
		}()
		if r.err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); r.err != nil {
			return
		}
		if r.err = unix.Mount(devDir, "/dev", "", unix.MS_BIND|unix.MS_REC, ""); r.err != nil {
			return
		}
		res := &cgroups.Resources{Devices: rules}
		if r.sd239, r.err = allowPaths(res, 239); r.err != nil {
			return
		}
		r.sd255, r.err = allowPaths(res, 255)
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("runc's systemd device translation in a private mount namespace: %v", r.err)
	}
	return r.sd239, r.sd255
}

// allowPaths returns the paths of the DeviceAllow entries runc gives
// systemd for res.
func allowPaths(res *cgroups.Resources, sdVer int) ([]string, error) {
	props, err := systemd.GenerateDeviceProps(res, sdVer)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, p := range props {
		if p.Name != "DeviceAllow" {
			continue
		}
		v := reflect.ValueOf(p.Value.Value())
		paths = paths[:0]
		for i := 0; i < v.Len(); i++ {
			e := v.Index(i)
			paths = append(paths, strings.TrimSpace(e.FieldByName("Path").String()))
		}
	}
	return paths, nil
}
