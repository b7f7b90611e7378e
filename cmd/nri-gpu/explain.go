package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/containerd/nri/pkg/api"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/plugin"
)

// kvFlag is a repeatable K=V flag.
type kvFlag struct{ kv [][2]string }

func (f *kvFlag) String() string { return "" }

func (f *kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not K=V", s)
	}
	f.kv = append(f.kv, [2]string{k, v})
	return nil
}

// explainPod is the pod explain asks about, as the runtime would hand it
// to nri-gpu: the sandbox and its containers in the order the kubelet
// creates them (init containers first).
type explainPod struct {
	pod  *api.PodSandbox
	ctrs []explainCtr
}

// explainCtr is one container of the pod, with what explain could not
// simulate about it.
type explainCtr struct {
	ctr   *api.Container
	init  bool
	notes []string
}

// Explained is nri-gpu explain's answer for one pod (its JSON form).
type Explained struct {
	Pod string `json:"pod"`
	// Notes say what of the node explain cannot know.
	Notes      []string             `json:"notes,omitempty"`
	Containers []ExplainedContainer `json:"containers"`
}

// ExplainedContainer is what one container would get and why.
type ExplainedContainer struct {
	Name string `json:"name"`
	Init bool   `json:"init,omitempty"`
	// Outcome is injected, untouched, voided or refused.
	Outcome string `json:"outcome"`
	// Kind is the kind of container the request path decided.
	Kind string `json:"kind,omitempty"`
	// Source is the request's carrier; Policy the key that decides on
	// it in the pod's namespace.
	Source string `json:"source,omitempty"`
	Policy string `json:"policy,omitempty"`
	// Note says why a request was dropped or voided; Error why it was
	// refused.
	Note         string                   `json:"note,omitempty"`
	Error        string                   `json:"error,omitempty"`
	GPUs         []explainGPU             `json:"gpus,omitempty"`
	Capabilities string                   `json:"capabilities,omitempty"`
	Files        int                      `json:"files,omitempty"`
	Warnings     []string                 `json:"warnings,omitempty"`
	Unsimulated  []string                 `json:"unsimulated,omitempty"`
	Adjustment   *api.ContainerAdjustment `json:"adjustment,omitempty"`
}

type explainGPU struct {
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	Model string `json:"model,omitempty"`
}

// Outcome of a container whose NVIDIA_VISIBLE_DEVICES the policy voided.
const outcomeVoided = "voided"

// explainCmd is nri-gpu explain: what each container of a pod would get
// on this node, and why, from the plugin's own request path
// (plugin.Handle, what CreateContainer runs) on a plugin of its own: the
// node discovered with the configuration as nri-gpu run does it, and a
// scratch allocation table (free, or the running plugin's with
// --status-socket). It connects to no runtime, makes no /dev/char link
// and writes no Event.
func explainCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "the node's configuration file (YAML); default: built-in defaults")
	file := fs.String("f", "", "a Pod manifest, YAML or JSON (- for standard input)")
	ns := fs.String("namespace", "", "the pod's namespace (default: the manifest's, else default)")
	podName := fs.String("pod", "", "the pod's name (default: the manifest's, else explain)")
	ctrName := fs.String("container", "main", "the container's name, without -f")
	ann, env := &kvFlag{}, &kvFlag{}
	fs.Var(ann, "annotation", "K=V: a pod annotation, added to the manifest's (repeatable)")
	fs.Var(env, "env", "K=V: an environment entry of every container, as its image would set it; the manifest's env wins (repeatable)")
	statusSocket := fs.String("status-socket", "", "start from the running plugin's allocation table, read from its status socket (e.g. "+status.DefaultSocket+"); default: a table where every GPU is free")
	format := fs.String("o", "table", "output format: table or json")
	lf := addLogFlags(fs, "warning")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	ep, err := buildPod(*file, *ns, *podName, *ctrName, ann.kv, env.kv)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(*cfgPath)
	if err != nil {
		return err
	}
	p, err := plugin.New(cfg, log)
	if err != nil {
		return err
	}
	if *statusSocket != "" {
		st, err := getStatus(*statusSocket)
		if err != nil {
			return err
		}
		hs, err := st.Holdings()
		if err != nil {
			return fmt.Errorf("the allocation table from %s: %w", *statusSocket, err)
		}
		p.Seed(hs)
	}
	out := explain(context.Background(), p, ep)
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return writeExplained(stdout, out)
}

// explain runs each container of ep through p's request path, in order;
// an init container stops before the next container is created, as under
// the kubelet, and gives back what it held.
func explain(ctx context.Context, p *plugin.Plugin, ep explainPod) Explained {
	out := Explained{Pod: ep.pod.GetNamespace() + "/" + ep.pod.GetName()}
	st := p.Node().State()
	if st.Config.Emit == config.EmitCDI {
		out.Notes = append(out.Notes, "emit: cdi: explain connects to no runtime, and answers as for one that does not resolve CDI devices (edits); a runtime that does gets CDI device names for the same GPUs")
	}
	for _, c := range ep.ctrs {
		adj, res, err := p.Handle(ctx, ep.pod, c.ctr)
		ec := ExplainedContainer{Name: c.ctr.GetName(), Init: c.init, Kind: res.Kind, Unsimulated: c.notes, Warnings: res.Warnings,
			Note: res.Selection.Note, Adjustment: adj}
		src := res.Request
		if rerr := (*request.Error)(nil); errors.As(err, &rerr) {
			src = request.Request{Source: rerr.Source} // a carrier that did not parse
		}
		if s := src.Source.String(); s != "" {
			ec.Source = s
			ec.Policy = st.Config.Policy.Setting(src.PolicySource())
		}
		switch {
		case err != nil:
			ec.Outcome, ec.Error = plugin.OutcomeRefused, err.Error()
		case res.Voided:
			ec.Outcome = outcomeVoided
		case adj != nil && res.Injected():
			ec.Outcome = plugin.OutcomeInjected
			ec.Capabilities, ec.Files = res.Selection.Caps.String(), res.Edits.Files
			for _, g := range res.GPUs {
				ec.GPUs = append(ec.GPUs, explainGPU{Name: inventory.UnitLabel(g.Index), UUID: g.UUID, Model: g.Model})
			}
		default:
			ec.Outcome = plugin.OutcomeUntouched
		}
		out.Containers = append(out.Containers, ec)
		if c.init && err == nil {
			_, _ = p.StopContainer(ctx, ep.pod, c.ctr)
		}
	}
	return out
}

// buildPod makes the pod explain asks about: from the Pod manifest file
// when given, else one container ctrName; then the flags' namespace,
// name, annotations and image environment.
func buildPod(file, ns, name, ctrName string, ann, env [][2]string) (explainPod, error) {
	var pod corev1.Pod
	if file != "" {
		data, err := readInput(file)
		if err != nil {
			return explainPod{}, err
		}
		if err := yaml.Unmarshal(data, &pod); err != nil {
			return explainPod{}, fmt.Errorf("-f %s: %v", file, err)
		}
		if pod.Kind != "Pod" {
			return explainPod{}, fmt.Errorf("-f %s: kind %q, want a Pod manifest (kind: Pod)", file, pod.Kind)
		}
		if len(pod.Spec.Containers) == 0 {
			return explainPod{}, fmt.Errorf("-f %s: the pod has no containers (spec.containers)", file)
		}
	} else {
		pod.Spec.Containers = []corev1.Container{{Name: ctrName}}
	}
	if ns != "" {
		pod.Namespace = ns
	}
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	if name != "" {
		pod.Name = name
	}
	if pod.Name == "" {
		pod.Name = "explain"
	}
	if pod.UID == "" {
		pod.UID = "explain"
	}
	for _, kv := range ann {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[kv[0]] = kv[1]
	}
	sandbox := &api.PodSandbox{Id: "explain-" + pod.Name, Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID), Annotations: pod.Annotations}
	ep := explainPod{pod: sandbox}
	for i, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		ec := sandboxContainer(sandbox, c, env)
		ec.init = i < len(pod.Spec.InitContainers)
		ep.ctrs = append(ep.ctrs, ec)
	}
	return ep, nil
}

// sandboxContainer is container c of the pod as the runtime hands it to
// NRI: its name, the image's environment under its own, and, when
// privileged, every device allowed. What the kubelet or the runtime
// would add and explain cannot know (GPUs assigned through resources,
// variables from references) is noted.
func sandboxContainer(pod *api.PodSandbox, c corev1.Container, image [][2]string) explainCtr {
	ec := explainCtr{ctr: &api.Container{Id: "explain-" + pod.GetName() + "-" + c.Name, PodSandboxId: pod.GetId(), Name: c.Name}}
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, kv := range image {
		set(kv[0], kv[1])
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			ec.notes = append(ec.notes, "env "+e.Name+": valueFrom is not resolved; left out")
			continue
		}
		set(e.Name, e.Value)
	}
	if len(c.EnvFrom) > 0 {
		ec.notes = append(ec.notes, "envFrom is not resolved; left out")
	}
	for _, k := range order {
		ec.ctr.Env = append(ec.ctr.Env, k+"="+vars[k])
	}
	if sc := c.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
		ec.ctr.Linux = &api.LinuxContainer{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}}}
	}
	var limits []string
	for r, q := range c.Resources.Limits {
		if strings.Contains(string(r), "/") {
			limits = append(limits, string(r)+": "+q.String())
		}
	}
	sort.Strings(limits)
	for _, l := range limits {
		ec.notes = append(ec.notes, "resources.limits "+l+": a device plugin's assignment is made by the kubelet when the container is created; not simulated (the container's own carriers are explained)")
	}
	for _, r := range c.Resources.Claims {
		ec.notes = append(ec.notes, "resources.claims "+r.Name+": a DRA claim's devices are prepared when the pod starts; not simulated")
	}
	return ec
}

// readInput reads a file, or standard input for "-".
func readInput(file string) ([]byte, error) {
	if file == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, 16<<20))
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("-f: %w", err)
	}
	return data, nil
}

// writeExplained prints out as text, one block per container.
func writeExplained(w io.Writer, out Explained) error {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s\n", out.Pod)
	for _, n := range out.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	for _, c := range out.Containers {
		init := ""
		if c.Init {
			init = " (init)"
		}
		fmt.Fprintf(&b, "\ncontainer %s%s: %s\n", c.Name, init, c.Outcome)
		line := func(k, v string) {
			if v != "" {
				fmt.Fprintf(&b, "  %-13s %s\n", k+":", v)
			}
		}
		line("kind", c.Kind)
		line("request", c.Source)
		line("policy", c.Policy)
		line("refused", c.Error)
		line("why", c.Note)
		var gpus []string
		for _, g := range c.GPUs {
			gpus = append(gpus, g.Name+" "+g.UUID+" "+g.Model)
		}
		line("gpus", strings.Join(gpus, "; "))
		line("capabilities", c.Capabilities)
		if c.Files > 0 {
			line("files", fmt.Sprintf("%d driver files", c.Files))
		}
		adjustmentLines(c.Adjustment, line)
		for _, s := range c.Warnings {
			line("warning", s)
		}
		for _, s := range c.Unsimulated {
			line("not simulated", s)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// adjustmentLines prints what the runtime would apply: device nodes,
// mounts, environment, CDI devices, annotations.
func adjustmentLines(adj *api.ContainerAdjustment, line func(k, v string)) {
	var devs, mounts, env, cdi, ann []string
	for _, d := range adj.GetLinux().GetDevices() {
		devs = append(devs, d.GetPath())
	}
	for _, m := range adj.GetMounts() {
		mounts = append(mounts, m.GetDestination()+" <- "+m.GetSource())
	}
	for _, e := range adj.GetEnv() {
		env = append(env, e.GetKey()+"="+e.GetValue())
	}
	for _, d := range adj.GetCDIDevices() {
		cdi = append(cdi, d.GetName())
	}
	for k, v := range adj.GetAnnotations() {
		ann = append(ann, k+"="+v)
	}
	sort.Strings(ann)
	line("device nodes", strings.Join(devs, ", "))
	for _, m := range mounts {
		line("mount", m)
	}
	for _, e := range env {
		line("env", e)
	}
	line("cdi devices", strings.Join(cdi, ", "))
	for _, a := range ann {
		line("annotation", a)
	}
}
