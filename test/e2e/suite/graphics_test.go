package suite

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/libcache"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestGraphicsCapabilities checks on containerd (no kubelet) that a
// container asking graphics,display,video for one GPU gets the driver's
// vendor files at the paths their loaders search, the video libraries,
// that GPU's DRM nodes only (usable by a non-root user of the nodes'
// group), its by-path links and the application profile naming its
// minor; and that a compute-only container of the same GPU gets none of
// it.
func TestGraphicsCapabilities(t *testing.T) {
	w := newWorld(t, simnode.LayoutRHEL, "")
	const idx = 1
	gpu := w.node.GPUs[idx]
	ann := map[string]string{"gpus.nri-gpu.dev/pod": fmt.Sprintf(`device=%d,"capabilities=graphics,display,video"`, idx)}
	user, render := int64(1000), int64(simnode.RenderGID)
	g := w.mustRun("gfx", ann, harness.ContainerSpec{Image: harness.GlibcImage, RunAsUser: &user, RunAsGroup: &render})

	var vendor []string
	for _, f := range w.node.Files {
		if f.Capability == simnode.CapGraphics || f.Capability == simnode.CapDisplay {
			vendor = append(vendor, f.Container...)
		}
	}
	if len(vendor) < 12 {
		t.Fatalf("the simulated node lists %d graphics and display files: %q", len(vendor), vendor)
	}
	for _, p := range vendor {
		if out, code := g.sh("test -f " + p + " && test -r " + p); code != 0 {
			t.Errorf("graphics container: %s missing or unreadable: %s", p, out)
		}
	}
	if out, _ := g.sh("cat /usr/share/glvnd/egl_vendor.d/10_nvidia.json /etc/vulkan/icd.d/nvidia_icd.json"); !strings.Contains(out, `"library_path" : "libEGL_nvidia.so.0"`) || !strings.Contains(out, `"library_path": "libGLX_nvidia.so.0"`) {
		t.Errorf("vendor JSON files:\n%s", out)
	}
	for _, lib := range []string{"libnvcuvid.so.1", "libnvidia-encode.so.1", "libnvidia-opticalflow.so.1", "libvdpau_nvidia.so.1", "libEGL_nvidia.so.0", "libnvidia-egl-gbm.so.1"} {
		if out, code := g.sh("test -r /usr/local/nvidia/lib64/" + lib); code != 0 {
			t.Errorf("graphics container: library %s missing: %s", lib, out)
		}
	}
	// GBM finds the NVIDIA backend, the node's libnvidia-allocator.so.1,
	// through GBM_BACKENDS_PATH.
	allocator := false
	for _, f := range w.node.Files {
		if f.SONAME != "libnvidia-allocator.so.1" {
			continue
		}
		allocator = true
		fi, err := os.Stat(filepath.Join(w.node.Root, f.Path))
		if err != nil {
			t.Fatal(err)
		}
		if out, code := g.sh(`echo "$GBM_BACKENDS_PATH"; wc -c < "$GBM_BACKENDS_PATH/nvidia-drm_gbm.so"`); code != 0 || strings.Join(strings.Fields(out), " ") != fmt.Sprintf("/usr/local/nvidia/lib64/gbm %d", fi.Size()) {
			t.Errorf("GBM backend: %q (%d), want /usr/local/nvidia/lib64/gbm and the allocator's %d bytes", out, code, fi.Size())
		}
	}
	if !allocator {
		t.Fatal("the simulated node has no libnvidia-allocator.so.1")
	}

	// Its GPU's DRM nodes open (no device behind them: ENXIO, so the
	// cgroup and the node's group let this non-root user in); another
	// GPU's are not there.
	for _, p := range []string{simnode.CardPath(idx), simnode.RenderPath(idx)} {
		if e := openError(g, p); !strings.Contains(e, enxio) {
			t.Errorf("open %s as uid 1000 gid %d: %q, want %q\n%s", p, simnode.RenderGID, e, enxio, g.view())
		}
	}
	if out, _ := g.sh("ls /dev/dri | sort"); strings.Join(strings.Fields(out), " ") != "by-path "+path.Base(simnode.CardPath(idx))+" "+path.Base(simnode.RenderPath(idx)) {
		t.Errorf("/dev/dri holds %q, want GPU %d's nodes and by-path only", out, idx)
	}
	if e := openError(g, simnode.RenderPath(idx+1)); !strings.Contains(e, "No such file") {
		t.Errorf("open another GPU's %s: %q, want no such file", simnode.RenderPath(idx+1), e)
	}
	link := "/dev/dri/by-path/pci-" + gpu.BusID + "-render"
	if out, code := g.sh("readlink " + link); code != 0 || strings.TrimSpace(out) != "../"+path.Base(simnode.RenderPath(idx)) {
		t.Errorf("readlink %s: %q (%d)", link, out, code)
	}
	if e := openError(g, link); !strings.Contains(e, enxio) {
		t.Errorf("open %s: %q, want %q", link, e, enxio)
	}
	profile := "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
	if out, code := g.sh("cat " + profile); code != 0 || out != string(libcache.ProfileContent(1<<uint(gpu.Minor))) {
		t.Errorf("%s: %q (%d), want the profile of minor %d", profile, out, code, gpu.Minor)
	}
	if out, code := g.sh("echo x > " + profile); code == 0 {
		t.Errorf("wrote the profile: %q", out)
	}

	// A user outside the nodes' group cannot open them, as on the host.
	other := int64(1000)
	o := w.mustRun("gfx-other-group", ann, harness.ContainerSpec{Image: harness.GlibcImage, RunAsUser: &user, RunAsGroup: &other})
	if e := openError(o, simnode.RenderPath(idx)); !strings.Contains(e, "Permission denied") {
		t.Errorf("open %s as gid 1000: %q, want permission denied", simnode.RenderPath(idx), e)
	}

	// The default capabilities get none of it.
	c := w.mustRun("compute", map[string]string{"gpus.nri-gpu.dev/pod": fmt.Sprint(idx)}, harness.ContainerSpec{Image: harness.GlibcImage})
	for _, p := range append(vendor, "/dev/dri", profile, "/usr/local/nvidia/lib64/libnvcuvid.so.1", "/usr/local/nvidia/lib64/libEGL_nvidia.so.0") {
		if out, code := c.sh("ls -d " + p); code == 0 {
			t.Errorf("compute,utility container has %s", strings.TrimSpace(out))
		}
	}
	if out, code := c.sh("gpucheck cuda nvml"); code != 0 || !strings.Contains(out, "devices=1") {
		t.Errorf("compute container gpucheck:\n%s", out)
	}
}
