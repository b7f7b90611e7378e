package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// Kubectl runs the cluster's kubectl as the cluster admin in the cluster's
// network namespace and returns its stdout; an error carries stderr.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.KubectlStdin(ctx, "", args...)
}

// KubectlStdin is Kubectl with stdin.
func (c *Cluster) KubectlStdin(ctx context.Context, stdin string, args ...string) (string, error) {
	return c.command(ctx, stdin, nil, c.Tools.Kubectl, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
}

// Helm runs the cluster's helm as the cluster admin (KUBECONFIG), with
// its cache, configuration and data under the cluster's directory.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	h := filepath.Join(c.Dir, "helm")
	env := []string{"KUBECONFIG=" + c.Kubeconfig, "HELM_CACHE_HOME=" + h + "/cache", "HELM_CONFIG_HOME=" + h + "/config", "HELM_DATA_HOME=" + h + "/data"}
	return c.command(ctx, "", env, c.Tools.Helm, args...)
}

// command runs bin with args in the cluster's network namespace.
func (c *Cluster) command(ctx context.Context, stdin string, env []string, bin string, args ...string) (string, error) {
	cmd := c.Net.NS.Command(ctx, bin, args...)
	cmd.Env = append(append(cmd.Environ(), "HOME="+c.Dir), env...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// Apply applies manifests (YAML or JSON, several documents) with kubectl
// apply -f -.
func (c *Cluster) Apply(ctx context.Context, manifests string) error {
	_, err := c.KubectlStdin(ctx, manifests, "apply", "-f", "-")
	return err
}

// GetJSON runs kubectl get args -o json and decodes its output into into.
func (c *Cluster) GetJSON(ctx context.Context, into any, args ...string) error {
	out, err := c.Kubectl(ctx, append(append([]string{"get"}, args...), "-o", "json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(out), into); err != nil {
		return fmt.Errorf("kubectl get %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// GetPod returns the pod ns/name.
func (c *Cluster) GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	var p corev1.Pod
	return &p, c.GetJSON(ctx, &p, "pod", "-n", ns, name)
}

// ListPods returns the pods of ns matching the label selector ("" = all).
func (c *Cluster) ListPods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	var l corev1.PodList
	args := []string{"pods", "-n", ns}
	if selector != "" {
		args = append(args, "-l", selector)
	}
	return l.Items, c.GetJSON(ctx, &l, args...)
}

// GetNode returns the Node object called name.
func (c *Cluster) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	var n corev1.Node
	return &n, c.GetJSON(ctx, &n, "node", name)
}

// Events returns the events of ns (all namespaces when ns is ""), matching
// the field selector when it is not "" (e.g. "involvedObject.name=p").
func (c *Cluster) Events(ctx context.Context, ns, fieldSelector string) ([]corev1.Event, error) {
	var l corev1.EventList
	args := []string{"events"}
	if ns == "" {
		args = append(args, "-A")
	} else {
		args = append(args, "-n", ns)
	}
	if fieldSelector != "" {
		args = append(args, "--field-selector", fieldSelector)
	}
	return l.Items, c.GetJSON(ctx, &l, args...)
}

// Exec runs cmd in a container of pod ns/name with kubectl exec (through
// the API server and the node's kubelet) and returns its stdout and
// stderr together; err is set when it exits non-zero.
func (c *Cluster) Exec(ctx context.Context, ns, pod, container string, cmd ...string) (string, error) {
	args := []string{"exec", "-n", ns, pod}
	if container != "" {
		args = append(args, "-c", container)
	}
	full := append([]string{"--kubeconfig", c.Kubeconfig}, append(append(args, "--"), cmd...)...)
	x := c.Net.NS.Command(ctx, c.Tools.Kubectl, full...)
	x.Env = append(x.Environ(), "HOME="+c.Dir)
	out, err := x.CombinedOutput()
	return string(out), err
}

// WaitFor polls cond every 250 ms until it returns true, fails, or timeout
// passes; the error then names what and cond's last message.
func WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, msg, err := cond()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s: %s", what, timeout, msg)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %s)", what, ctx.Err(), msg)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// NodeCondition is the status of a Node's condition type ("" when absent).
func NodeCondition(n *corev1.Node, t corev1.NodeConditionType) corev1.ConditionStatus {
	for _, cond := range n.Status.Conditions {
		if cond.Type == t {
			return cond.Status
		}
	}
	return ""
}

// WaitNodeReady waits until node name is registered and Ready.
func (c *Cluster) WaitNodeReady(ctx context.Context, name string, timeout time.Duration) error {
	return WaitFor(ctx, timeout, "node "+name+" Ready", func() (bool, string, error) {
		n, err := c.GetNode(ctx, name)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, cond.Reason + ": " + cond.Message, nil
			}
		}
		return false, "no Ready condition", nil
	})
}

// PodReady says whether a pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitPodRunning waits until pod ns/name is Running (and Ready when it
// has a readiness probe or is otherwise marked Ready) and returns it.
func (c *Cluster) WaitPodRunning(ctx context.Context, ns, name string, timeout time.Duration) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := WaitFor(ctx, timeout, "pod "+ns+"/"+name+" Running", func() (bool, string, error) {
		p, err := c.GetPod(ctx, ns, name)
		if err != nil {
			return false, err.Error(), nil
		}
		pod = p
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, "", fmt.Errorf("phase %s: %s", p.Status.Phase, PodSummary(p))
		}
		return p.Status.Phase == corev1.PodRunning && PodReady(p), PodSummary(p), nil
	})
	return pod, err
}

// PodSummary is a pod's phase, node, conditions and containers' states in
// one line, for failure messages.
func PodSummary(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s on %q", p.Status.Phase, p.Spec.NodeName)
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue {
			fmt.Fprintf(&b, "; %s=%s %s %s", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
	}
	for _, s := range p.Status.ContainerStatuses {
		switch {
		case s.State.Waiting != nil:
			fmt.Fprintf(&b, "; %s waiting %s %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
		case s.State.Terminated != nil:
			fmt.Fprintf(&b, "; %s terminated %s exit %d", s.Name, s.State.Terminated.Reason, s.State.Terminated.ExitCode)
		default:
			fmt.Fprintf(&b, "; %s running restarts=%d", s.Name, s.RestartCount)
		}
	}
	return b.String()
}

// WaitDaemonSetReady waits until DaemonSet ns/name has want pods
// scheduled, updated and ready.
func (c *Cluster) WaitDaemonSetReady(ctx context.Context, ns, name string, want int32, timeout time.Duration) error {
	return WaitFor(ctx, timeout, "daemonset "+ns+"/"+name+" ready on "+fmt.Sprint(want)+" nodes", func() (bool, string, error) {
		var ds appsv1.DaemonSet
		if err := c.GetJSON(ctx, &ds, "daemonset", "-n", ns, name); err != nil {
			return false, err.Error(), nil
		}
		s := ds.Status
		msg := fmt.Sprintf("desired %d, updated %d, ready %d, available %d (generation %d, observed %d)",
			s.DesiredNumberScheduled, s.UpdatedNumberScheduled, s.NumberReady, s.NumberAvailable, ds.Generation, s.ObservedGeneration)
		return s.ObservedGeneration >= ds.Generation && s.DesiredNumberScheduled == want && s.UpdatedNumberScheduled == want &&
			s.NumberReady == want && s.NumberAvailable == want, msg, nil
	})
}
