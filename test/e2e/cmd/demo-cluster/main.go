// Command demo-cluster brings up the suite's two-node Kubernetes cluster
// from cached binaries (a real control plane; gpu-a on containerd with four
// simulated GPUs, gpu-b on CRI-O with three, one excluded by the driver),
// installs nri-gpu with kubectl apply -k, runs three GPU pods that the
// scheduler places, prints what each container sees, and tears everything
// down. Run it as root through `make demo-cluster`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

func main() {
	version := flag.String("version", harness.KubernetesVersion, "the Kubernetes version")
	repo := flag.String("repo", "../..", "the nri-gpu checkout (its image is built from it)")
	flag.Parse()
	if err := run(*version, *repo); err != nil {
		fmt.Fprintln(os.Stderr, "demo-cluster:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

func run(version, repo string) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (it runs a cluster, runtimes and namespaces)")
	}
	repo, err = filepath.Abs(repo)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	harness.Logf = func(string, ...any) {}

	step("make image: nri-gpu's release image from %s", repo)
	images, err := harness.ClusterImages(ctx, repo, "")
	if err != nil {
		return err
	}
	step("starting Kubernetes %s: etcd, kube-apiserver (TLS, Node,RBAC), controller manager, scheduler; nodes gpu-a (containerd, 4 GPUs) and gpu-b (CRI-O, 3 GPUs, 1 excluded)", version)
	start := time.Now()
	c, err := harness.StartCluster(ctx, harness.ClusterOptions{Version: version, Nodes: harness.GPUNodes(), Images: images})
	if err != nil {
		return err
	}
	defer func() {
		step("tearing the cluster down")
		if e := c.Stop(); e != nil && err == nil {
			err = e
		}
	}()
	step("cluster ready in %s", time.Since(start).Round(100*time.Millisecond))
	kubectl := func(args ...string) (string, error) { return c.Kubectl(ctx, args...) }
	for _, n := range c.Nodes {
		if _, err := kubectl("label", "node", n.Name, "nvidia.com/gpu.present=true"); err != nil {
			return err
		}
	}
	step("kubectl apply -k test/e2e/cluster/kustomize")
	out, err := kubectl("apply", "-k", harness.KustomizeOverlay(repo))
	if err != nil {
		return err
	}
	fmt.Println(indent(out))
	if err := c.WaitDaemonSetReady(ctx, "nri-gpu", "nri-gpu", int32(len(c.Nodes)), 3*time.Minute); err != nil {
		return err
	}
	out, err = kubectl("get", "nodes", "-o", "custom-columns=NODE:.metadata.name,GPUS:.status.allocatable.nvidia\\.com/gpu,RUNTIME:.status.nodeInfo.containerRuntimeVersion,KUBELET:.status.nodeInfo.kubeletVersion")
	if err != nil {
		return err
	}
	fmt.Println(indent(out))
	return runPods(ctx, c)
}

// demoPods are the three GPU pods: name and GPUs.
var demoPods = []struct {
	name string
	gpus int
}{{"train", 2}, {"infer-1", 1}, {"infer-2", 1}}

func runPods(ctx context.Context, c *harness.Cluster) error {
	for _, p := range demoPods {
		step("pod %s with resources.limits nvidia.com/gpu: %d", p.name, p.gpus)
		manifest := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {limits: {nvidia.com/gpu: %d}}
`, p.name, harness.GlibcImage, p.gpus)
		if err := c.Apply(ctx, manifest); err != nil {
			return err
		}
	}
	for _, p := range demoPods {
		pod, err := c.WaitPodRunning(ctx, "default", p.name, 2*time.Minute)
		if err != nil {
			return err
		}
		show(ctx, c, pod)
	}
	return nil
}

// show prints where the scheduler put pod and what its container sees.
func show(ctx context.Context, c *harness.Cluster, pod *corev1.Pod) {
	out, err := c.Exec(ctx, pod.Namespace, pod.Name, "main", "sh", "-c",
		`echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; ls /dev | grep nvidia | tr '\n' ' '; echo; gpucheck cuda`)
	if err != nil {
		out += "(exit: " + err.Error() + ")"
	}
	var devs []string
	if n := c.Node(pod.Spec.NodeName); n != nil {
		cp, err := harness.ReadDeviceCheckpointAt(n.HostPath(harness.KubeletCheckpoint))
		if err == nil {
			for _, e := range cp.Entries {
				if e.PodUID == string(pod.UID) {
					devs = append(devs, e.DeviceIDs...)
				}
			}
		}
	}
	sort.Strings(devs)
	fmt.Printf("==> %s on node %s, the kubelet assigned %s; in the container:\n%s\n", pod.Name, pod.Spec.NodeName, strings.Join(devs, ","), indent(out))
}
