package suite

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// gpuNodes returns the /dev/nvidia<N> GPU nodes a container sees.
func gpuNodes(c *ctr) []string {
	out, _ := c.sh("ls /dev")
	var nodes []string
	for _, f := range strings.Fields(out) {
		if regexp.MustCompile(`^nvidia[0-9]+$`).MatchString(f) {
			nodes = append(nodes, "/dev/"+f)
		}
	}
	sort.Strings(nodes)
	return nodes
}

func envOf(c *ctr, key string) string {
	out, code := c.sh(`[ -n "${` + key + `+set}" ] && echo "$` + key + `"`)
	if code != 0 {
		return "(unset)"
	}
	return strings.TrimSpace(out)
}

// majorMinor returns "major:minor" of a device node in the container.
func majorMinor(c *ctr, p string) string {
	out, code := c.sh("stat -c '%t %T' " + p)
	if code != 0 {
		return "missing"
	}
	var maj, min int
	fmt.Sscanf(out, "%x %x", &maj, &min)
	return fmt.Sprintf("%d:%d", maj, min)
}

// openError tries to read a device node and returns the error text.
func openError(c *ctr, p string) string {
	out, _ := c.sh("head -c 1 " + p + " 2>&1 >/dev/null")
	return out
}

const (
	enxio = "No such device or address" // the cgroup allows the node; no real GPU behind it
	eperm = "Operation not permitted"   // the cgroup denies it
)

// TestE2E runs the suite's checks against one containerd, on a node with
// the RHEL library layout (and the Debian one where the layout matters).
func TestE2E(t *testing.T) {
	w := newWorld(t, simnode.LayoutRHEL, "")
	n := w.node

	t.Run("annotation device=0,2", func(t *testing.T) {
		c := w.mustRun("train", map[string]string{"gpus.nri-gpu.dev/container.train": `"device=0,2"`}, harness.ContainerSpec{})
		g0, g2 := n.GPUs[0], n.GPUs[2]
		want := []string{fmt.Sprintf("/dev/nvidia%d", g0.Minor), fmt.Sprintf("/dev/nvidia%d", g2.Minor)}
		sort.Strings(want)
		if got := gpuNodes(c); !slices.Equal(got, want) {
			t.Errorf("GPU nodes %q, want exactly %q\n%s", got, want, c.view())
		}
		for p, mm := range map[string]string{
			fmt.Sprintf("/dev/nvidia%d", g0.Minor): fmt.Sprintf("195:%d", g0.Minor),
			fmt.Sprintf("/dev/nvidia%d", g2.Minor): fmt.Sprintf("195:%d", g2.Minor),
			"/dev/nvidiactl":                       "195:255",
			"/dev/nvidia-uvm":                      fmt.Sprintf("%d:0", n.UVMMajor),
			"/dev/nvidia-uvm-tools":                fmt.Sprintf("%d:1", n.UVMMajor),
		} {
			if got := majorMinor(c, p); got != mm {
				t.Errorf("%s is %s, want %s", p, got, mm)
			}
			if e := openError(c, p); !strings.Contains(e, enxio) {
				t.Errorf("opening %s: %q, want %q (the cgroup must allow it)", p, e, enxio)
			}
		}
		if got := majorMinor(c, "/dev/nvidia-modeset"); got != "missing" {
			t.Errorf("/dev/nvidia-modeset injected without display capability")
		}
		if got, want := envOf(c, "NVIDIA_VISIBLE_DEVICES"), g0.UUID+","+g2.UUID; got != want {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, want)
		}
		// A GPU node created by hand inside the container is denied by the
		// cgroup: the injection granted only its own nodes.
		other := n.GPUs[1].Minor
		if out, code := c.sh(fmt.Sprintf("mknod /tmp/x c 195 %d && head -c 1 /tmp/x", other)); code == 0 || !strings.Contains(out, eperm) {
			t.Errorf("a non-injected GPU minor %d was usable: %q", other, out)
		}
	})

	t.Run("env all, void and no request", func(t *testing.T) {
		c := w.mustRun("envall", nil, harness.ContainerSpec{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}})
		if got := gpuNodes(c); len(got) != 4 {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=all: GPU nodes %q, want 4\n%s", got, c.view())
		}
		for _, tc := range []struct {
			name string
			env  map[string]string
		}{{"void", map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}}, {"none-requested", nil}} {
			c := w.mustRun(tc.name, nil, harness.ContainerSpec{Env: tc.env})
			if out, _ := c.sh("ls /dev | grep nvidia"); out != "" {
				t.Errorf("%s: container got device nodes:\n%s", tc.name, out)
			}
			if _, code := c.sh("ls -d /usr/local/nvidia"); code == 0 {
				t.Errorf("%s: container got /usr/local/nvidia", tc.name)
			}
			if got := envOf(c, "LD_LIBRARY_PATH"); got != "(unset)" {
				t.Errorf("%s: LD_LIBRARY_PATH=%q", tc.name, got)
			}
			spec, err := w.cri.RuntimeSpec(w.ctx, c.id)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range spec.Mounts {
				if strings.HasPrefix(m.Source, n.Root) {
					t.Errorf("%s: mount %+v", tc.name, m)
				}
			}
			for _, d := range spec.Linux.Devices {
				if strings.Contains(d.Path, "nvidia") {
					t.Errorf("%s: device %+v", tc.name, d)
				}
			}
		}
	})

	t.Run("non-root user opens the nodes", func(t *testing.T) {
		uid := int64(1000)
		c := w.mustRun("nonroot", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{RunAsUser: &uid})
		if out, _ := c.sh("id -u"); strings.TrimSpace(out) != "1000" {
			t.Fatalf("runs as %q", out)
		}
		for _, p := range append(gpuNodes(c), "/dev/nvidiactl", "/dev/nvidia-uvm") {
			if e := openError(c, p); !strings.Contains(e, enxio) {
				t.Errorf("uid 1000 opening %s: %q, want %q", p, e, enxio)
			}
		}
	})

	t.Run("bad requests fail and leave nothing behind", func(t *testing.T) {
		for i, tc := range []struct {
			ann  map[string]string
			env  map[string]string
			want string
		}{
			{map[string]string{"gpus.nri-gpu.dev/pod": "device=7"}, nil, `nri-gpu: annotation gpus.nri-gpu.dev/pod: unknown GPU "7" (node has 0-3)`},
			{map[string]string{"gpus.nri-gpu.dev/pod": "5"}, nil, `count 5 exceeds the node's 4 GPUs (0-3)`},
			{map[string]string{"gpus.nri-gpu.dev/pod": "device=0,1"}, nil, `quote a device list that has commas`},
			{map[string]string{"gpus.nri-gpu.dev/pod": "all,capabilities=teleport"}, nil, `unsupported capability "teleport"`},
			{nil, map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-00000000-0000-0000-0000-000000000000"}, `nri-gpu: env NVIDIA_VISIBLE_DEVICES: unknown GPU`},
		} {
			name := fmt.Sprintf("bad%d", i)
			pod, err := w.cri.RunPod(w.ctx, name, tc.ann)
			if err != nil {
				t.Fatal(err)
			}
			_, err = w.cri.CreateContainer(w.ctx, pod, harness.ContainerSpec{Name: name, Image: harness.BusyboxImage, Env: tc.env, Command: []string{"sleep", "3600"}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CreateContainer with %v %v: %v, want an error containing %q", tc.ann, tc.env, err, tc.want)
			}
			ctrs, err := w.cri.ListContainers(w.ctx, pod)
			if err != nil || len(ctrs) != 0 {
				t.Errorf("after a refused creation the pod has containers %v (%v)", ctrs, err)
			}
			w.cri.StopPod(w.ctx, pod)
			w.cri.RemovePod(w.ctx, pod)
		}
	})

	t.Run("mounts are read-only and images keep working", func(t *testing.T) {
		c := w.mustRun("hardened", map[string]string{"gpus.nri-gpu.dev/pod": "1"},
			harness.ContainerSpec{Image: harness.GlibcImage, ReadOnlyRootfs: true, DropAllCaps: true, RunAsUser: ptr(int64(1000))})
		if out, code := c.sh("gpucheck cuda nvml"); code != 0 {
			t.Errorf("gpucheck in a read-only, capability-less, non-root container failed:\n%s\n%s", out, c.view())
		}
		for _, p := range []string{"/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/bin/nvidia-smi"} {
			if out, code := c.sh("echo x >> " + p); code == 0 {
				t.Errorf("wrote to %s from the container: %q", p, out)
			}
		}
		out, _ := c.sh("grep -E 'nvidia|firmware' /proc/self/mountinfo")
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(l)
			if len(f) >= 5 && f[4] == "/sys/firmware" {
				continue // CRI-O masks /sys/firmware with a read-only tmpfs: the runtime's, not nri-gpu's
			}
			if len(f) < 6 || !strings.Contains(","+f[5]+",", ",ro,") || !strings.Contains(f[5], "nosuid") || !strings.Contains(f[5], "nodev") {
				t.Errorf("mount not ro,nosuid,nodev: %s", l)
			}
		}
		app := w.mustRun("app", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{Image: harness.GlibcAppImage})
		if out, code := app.sh("gpucheck app cuda nvml"); code != 0 {
			t.Errorf("an image with its own LD_LIBRARY_PATH lost its libraries or the driver's:\n%s\n%s", out, app.view())
		}
		if got := envOf(app, "LD_LIBRARY_PATH"); got != "/opt/app/lib:/usr/local/nvidia/lib64" {
			t.Errorf("LD_LIBRARY_PATH=%q", got)
		}
	})

	t.Run("plugin and containerd restarts", func(t *testing.T) {
		held := w.mustRun("held", map[string]string{"gpus.nri-gpu.dev/pod": "2"}, harness.ContainerSpec{})
		w.plugin.stop()
		w.plugin = startPlugin(t, w.c, w.node)
		if c, err := w.run("afterplugin", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{}); err != nil || len(gpuNodes(c)) != 1 {
			t.Fatalf("after a plugin restart: %v", err)
		}
		if err := w.c.Restart(w.ctx); err != nil {
			t.Fatal(err)
		}
		// The plugin reconnects by itself.
		deadline := time.Now().Add(30 * time.Second)
		for strings.Count(w.plugin.log.String(), "synchronized with the runtime") < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("nri-gpu did not reconnect after the containerd restart:\n%s", w.plugin.log.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		c, err := w.run("aftercontainerd", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{})
		if err != nil || len(gpuNodes(c)) != 1 {
			t.Fatalf("after a containerd restart: %v", err)
		}
		if got := gpuNodes(held); len(got) != 2 {
			t.Errorf("the running container lost its GPUs: %q", got)
		}
	})
}

// TestLibrariesByLayout checks that dlopen by SONAME works without hooks
// for a Debian-like image on both host layouts, in both library modes;
// that nvidia-smi runs by name; and that compute-only requests get
// no utility binaries. The GSP firmware directory: the directory runs keep
// the default (firmware: auto, on simnode's 6.8 kernel: not mounted), the
// files runs ask for it (firmware: mount).
func TestLibrariesByLayout(t *testing.T) {
	c := startRuntime(t, harness.RuntimeOptions{})
	for _, layout := range []simnode.Layout{simnode.LayoutRHEL, simnode.LayoutDebian} {
		for _, mode := range []string{"directory", "files"} {
			t.Run(string(layout)+"/"+mode, func(t *testing.T) {
				firmware := mode == "files"
				extra := "libraryMode: " + mode + "\n"
				if firmware {
					extra += "firmware: mount\n"
				}
				n := newNode(t, layout, extra)
				w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: t.Context()}
				w.plugin = startPlugin(t, c, n)
				g := w.mustRun("dl", map[string]string{"gpus.nri-gpu.dev/pod": "2"}, harness.ContainerSpec{Image: harness.GlibcImage})
				out, code := g.sh("gpucheck cuda nvml")
				if code != 0 || !strings.Contains(out, "libcuda.so.1: ok") || !strings.Contains(out, "driver="+n.DriverVersion) {
					t.Errorf("gpucheck:\n%s\n%s", out, g.view())
				}
				if !strings.Contains(out, "devices=2") {
					t.Errorf("the driver does not see 2 GPUs:\n%s", out)
				}
				if out, code := g.sh("nvidia-smi"); code != 0 || !strings.Contains(out, "NVIDIA-SMI "+n.DriverVersion) {
					t.Errorf("nvidia-smi: %d %q", code, out)
				}
				// CRI-O 1.34 keeps the image's PATH: the binaries are at
				// /usr/bin there (TestDefaultLayout).
				bin := "/usr/local/nvidia/bin/"
				if onCRIO() {
					bin = "/usr/bin/"
				}
				if out, _ := g.sh("ls " + bin + " | grep -c nvidia-cuda-mps"); strings.TrimSpace(out) != "2" {
					t.Errorf("compute binaries missing: %q", out)
				}
				fw := "/lib/firmware/nvidia/" + n.DriverVersion
				out, code = g.sh("ls " + fw)
				switch {
				case firmware && (code != 0 || !strings.Contains(out, "gsp_ga10x.bin")):
					t.Errorf("firmware: mount, but the container has no %s:\n%s", fw, out)
				case !firmware && code == 0:
					t.Errorf("firmware: auto on kernel %s, but the container has %s:\n%s", simnode.DefaultKernelRelease, fw, out)
				}

				cc := w.mustRun("computeonly", map[string]string{"gpus.nri-gpu.dev/pod": "1,capabilities=compute"}, harness.ContainerSpec{Image: harness.GlibcImage})
				if out, code := cc.sh("gpucheck cuda"); code != 0 {
					t.Errorf("compute-only gpucheck cuda:\n%s", out)
				}
				if out, code := cc.sh("ls " + bin + "nvidia-smi /usr/local/nvidia/lib64/libnvidia-ml.so.1"); code == 0 {
					t.Errorf("compute-only request got utility files:\n%s", out)
				}
			})
		}
	}
}

// TestDriverUpgrade checks that containers started after a driver upgrade
// (and the plugin's rediscovery) get the new version, while running ones
// keep theirs.
func TestDriverUpgrade(t *testing.T) {
	w := newWorld(t, simnode.LayoutRHEL, "")
	before := w.mustRun("before", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{Image: harness.GlibcImage})
	if _, err := simnode.Upgrade(w.node.Node, "590.44.01", simnode.Options{DeviceNodes: true}); err != nil {
		t.Fatal(err)
	}
	w.plugin.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(w.plugin.log.String(), "driver=590.44.01") {
		if time.Now().After(deadline) {
			t.Fatalf("no rediscovery after SIGHUP:\n%s", w.plugin.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	after := w.mustRun("after", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{Image: harness.GlibcImage})
	if out, code := after.sh("gpucheck nvml"); code != 0 || !strings.Contains(out, "driver=590.44.01") {
		t.Errorf("new container: %q", out)
	}
	if out, code := before.sh("gpucheck nvml"); code != 0 || !strings.Contains(out, "driver=580.126.09") {
		t.Errorf("running container lost its driver: %q\n%s", out, before.view())
	}
}

func ptr[T any](v T) *T { return &v }
