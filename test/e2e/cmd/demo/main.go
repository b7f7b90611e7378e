// Command demo brings up a simulated 4-GPU node, a private containerd with
// NRI and nri-gpu, starts three pods (A and B share GPU 0, C asks for all
// GPUs: the picture of the tutorials), prints what each container sees, and
// cleans up. Run it as root through `make demo`.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

func main() {
	bin := flag.String("nri-gpu", "bin/nri-gpu", "the nri-gpu binary to run")
	rt := flag.String("runtime", "", "the runtime: containerd-"+strings.TrimPrefix(harness.DefaultContainerdVersion, "v")+
		" (default) or crio-"+strings.TrimPrefix(harness.CRIOVersion, "v"))
	flag.Parse()
	if err := run(*bin, *rt); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(bin, runtime string) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (it runs containerd and runc)")
	}
	crio := "crio-" + strings.TrimPrefix(harness.CRIOVersion, "v")
	switch runtime {
	case "", "containerd-" + strings.TrimPrefix(harness.DefaultContainerdVersion, "v"), crio:
	default:
		return fmt.Errorf("-runtime %q: valid are containerd-%s and %s", runtime, strings.TrimPrefix(harness.DefaultContainerdVersion, "v"), crio)
	}
	bin, err = filepath.Abs(bin)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	harness.Logf = func(string, ...any) {}

	step("installing containerd %s and runc %s (cached after the first run)", harness.DefaultContainerdVersion, harness.RuncVersion)
	tools, err := harness.InstallTools(ctx, "", harness.DefaultContainerdVersion)
	if err != nil {
		return err
	}
	imgs, err := harness.BuildImages(ctx, "")
	if err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "nri-gpu-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	step("simulating a node with 4 GPUs in %s", dir)
	node, err := simnode.Generate(filepath.Join(dir, "node"), simnode.Options{NumGPUs: 4, DeviceNodes: true, Layout: simnode.LayoutRHEL})
	if err != nil {
		return err
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n", node.Root, node.Root)), 0o644); err != nil {
		return err
	}
	out, _ := exec.Command(bin, "inventory", "--config", cfg).CombinedOutput()
	fmt.Printf("%s\n", indent(string(out)))

	var c harness.Runtime
	if runtime == crio {
		step("installing CRI-O %s (built from source on the first run, a few minutes), conmon and skopeo", harness.CRIOVersion)
		ct, err := harness.InstallCRIO(ctx, "")
		if err != nil {
			return err
		}
		step("starting CRI-O with NRI")
		if c, err = harness.StartCRIO(ctx, harness.CRIOOptions{Tools: tools, CRIO: ct, Images: imgs}); err != nil {
			return err
		}
	} else {
		step("starting containerd with NRI")
		if c, err = harness.StartContainerd(ctx, harness.ContainerdOptions{Tools: tools, Images: imgs}); err != nil {
			return err
		}
	}
	defer func() {
		step("cleaning up")
		if e := c.Stop(); e != nil && err == nil {
			err = e
		}
	}()

	step("starting nri-gpu")
	var log bytes.Buffer
	plugin := exec.Command(bin, "run", "--config", cfg, "--socket", c.NRISocketPath())
	plugin.Stdout, plugin.Stderr = &log, &log
	if err := plugin.Start(); err != nil {
		return err
	}
	defer func() { _ = plugin.Process.Kill(); _ = plugin.Wait() }() // the demo is over
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(log.String(), "synchronized with the runtime"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("nri-gpu did not connect:\n%s", log.String())
		}
	}

	cri := c.CRI()
	for _, p := range []struct{ name, ann string }{
		{"container-a", "device=0"},
		{"container-b", "device=0"},
		{"container-c", "all"},
	} {
		step("pod %s with annotation gpus.nri-gpu.dev/container.%s: %q", p.name, p.name, p.ann)
		pod, err := cri.RunPod(ctx, p.name, map[string]string{"gpus.nri-gpu.dev/container." + p.name: p.ann})
		if err != nil {
			return err
		}
		id, err := cri.Run(ctx, pod, harness.ContainerSpec{Name: p.name, Image: harness.GlibcImage, Command: []string{"sleep", "3600"}})
		if err != nil {
			return err
		}
		o, e, _, err := cri.Exec(ctx, id, "sh", "-c",
			`echo "device nodes: $(ls /dev | grep nvidia | tr '\n' ' ')"; echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; gpucheck cuda nvml; nvidia-smi`)
		if err != nil {
			return err
		}
		fmt.Println(indent(o + e))
	}
	fmt.Println(indent("nri-gpu log:\n" + log.String()))
	return nil
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}
