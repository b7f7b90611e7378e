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
	rt := flag.String("runtime", harness.RuntimeContainerd24, "the runtime: "+strings.Join(harness.Runtimes, ", "))
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
	bin, err = filepath.Abs(bin)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	harness.Logf = func(string, ...any) {}

	if harness.ContainerdVersionOf(runtime) == "" {
		return fmt.Errorf("unknown runtime %q: want %s, %s or %s", runtime, harness.RuntimeContainerd24, harness.RuntimeContainerd22, harness.RuntimeContainerd17)
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

	step("installing %s and runc %s (cached after the first run), starting it with NRI", runtime, harness.RuncVersion)
	c, err := harness.StartRuntime(ctx, runtime, harness.RuntimeOptions{})
	if err != nil {
		return err
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
