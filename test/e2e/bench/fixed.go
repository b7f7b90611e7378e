package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/plugin"
)

// FixedPluginEnv names the environment variable that turns a program using
// this package into the fixed-adjustment plugin: its value is the path of
// the plugin's case file. Programs call RunFixedPluginIfAsked first thing.
const FixedPluginEnv = "NRI_GPU_BENCH_FIXED_PLUGIN"

// FixedAnnotation is the pod annotation that asks the fixed plugin for one
// of its precomputed adjustments, by key.
const FixedAnnotation = "bench.nri-gpu.dev/fixed"

// fixedCase is one precomputed adjustment: nri-gpu's answer, with the
// configuration in Config, to a container named "bench" whose pod carries
// gpus.nri-gpu.dev/container.bench: Request.
type fixedCase struct {
	Key     string `json:"key"`
	Config  string `json:"config"`
	Request string `json:"request"`
	// Strip, for measuring what parts of the adjustment cost, removes
	// mounts from it: "mounts" keeps the device nodes (and env) only,
	// "files" keeps the library directories but not the single-file
	// mounts (binaries, firmware).
	Strip string `json:"strip,omitempty"`
}

type fixedFile struct {
	Socket string      `json:"socket"`
	Cases  []fixedCase `json:"cases"`
}

// computeAdjustments asks nri-gpu's own code (plugin.New with the same
// configuration file, then its CreateContainer) for the adjustment of each
// case, once.
func computeAdjustments(cases []fixedCase, log *logrus.Logger) (map[string]*api.ContainerAdjustment, error) {
	plugins := map[string]*plugin.Plugin{}
	out := map[string]*api.ContainerAdjustment{}
	for _, c := range cases {
		p := plugins[c.Config]
		if p == nil {
			cfg, err := config.Load(c.Config)
			if err != nil {
				return nil, err
			}
			if p, err = plugin.New(cfg, log); err != nil {
				return nil, err
			}
			plugins[c.Config] = p
		}
		cfg := p.Node().Config()
		pod := &api.PodSandbox{Name: "fixed", Namespace: "default", Annotations: map[string]string{"gpus.nri-gpu.dev/container." + benchContainer: c.Request}}
		adj, _, err := p.CreateContainer(context.Background(), pod, &api.Container{Name: benchContainer})
		if err != nil {
			return nil, fmt.Errorf("case %s: %w", c.Key, err)
		}
		if adj == nil {
			return nil, fmt.Errorf("case %s: nri-gpu injects nothing for %q", c.Key, c.Request)
		}
		switch c.Strip {
		case "":
		case "mounts":
			adj.Mounts = nil
		case "files":
			var keep []*api.Mount
			for _, m := range adj.Mounts {
				if m.Destination == cfg.LibraryDir || m.Destination == cfg.Library32Dir {
					keep = append(keep, m)
				}
			}
			adj.Mounts = keep
		default:
			return nil, fmt.Errorf("case %s: unknown strip %q", c.Key, c.Strip)
		}
		out[c.Key] = adj
	}
	return out, nil
}

// fixedPlugin answers CreateContainer with a precomputed adjustment for pods
// annotated with FixedAnnotation, and with nothing otherwise: the least any
// NRI plugin can do to inject the same files.
type fixedPlugin struct {
	adj map[string]*api.ContainerAdjustment
	log io.Writer
}

// Synchronize reports that the plugin is connected (the benchmark waits for
// this line).
func (p *fixedPlugin) Synchronize(context.Context, []*api.PodSandbox, []*api.Container) ([]*api.ContainerUpdate, error) {
	fmt.Fprintln(p.log, "bench-fixed: synchronized with the runtime")
	return nil, nil
}

func (p *fixedPlugin) CreateContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	key, ok := pod.GetAnnotations()[FixedAnnotation]
	if !ok {
		return nil, nil, nil
	}
	adj := p.adj[key]
	if adj == nil {
		return nil, nil, fmt.Errorf("bench-fixed: no precomputed adjustment %q", key)
	}
	return adj, nil, nil
}

// RunFixedPluginIfAsked runs the fixed-adjustment plugin and exits when
// FixedPluginEnv is set; otherwise it returns at once.
func RunFixedPluginIfAsked() {
	file := os.Getenv(FixedPluginEnv)
	if file == "" {
		return
	}
	if err := runFixedPlugin(file, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench-fixed:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runFixedPlugin(file string, logOut io.Writer) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var f fixedFile
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	log := logrus.New()
	log.SetOutput(logOut)
	log.SetLevel(logrus.WarnLevel)
	adj, err := computeAdjustments(f.Cases, log)
	if err != nil {
		return err
	}
	s, err := stub.New(&fixedPlugin{adj: adj, log: logOut}, stub.WithPluginName("bench-fixed"), stub.WithPluginIdx("20"), stub.WithSocketPath(f.Socket),
		stub.WithOnClose(func() { os.Exit(0) }))
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	fmt.Fprintf(logOut, "bench-fixed: %d adjustments ready\n", len(adj))
	return s.Run(ctx)
}
