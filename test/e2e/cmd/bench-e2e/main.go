// Command bench-e2e measures container start latency through CRI on a real
// containerd with nri-gpu beside the other ways of injecting a GPU (see
// package bench), and prints markdown tables to stdout. Run it as root
// through `make bench-e2e`.
//
//	bench-e2e [-nri-gpu bin/nri-gpu] [-rounds 80] [-scaling-rounds 30]
//	          [-paths floor,nri-gpu,nri-gpu-toolkit-layout,cdi,cdi-toolkit-layout,toolkit,nvidia-runtime]
//	          [-phases main,files,scaling,emit-cdi] [-gpus 1,4,8]
//	          [-caps 'utility;compute,utility;all'] [-runtime containerd-1.7.36|crio-1.34.0]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/bench"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

func main() {
	// The floor plugin is this same program, started again by the benchmark.
	bench.RunFixedPluginIfAsked()

	bin := flag.String("nri-gpu", "bin/nri-gpu", "the nri-gpu binary to measure")
	rounds := flag.Int("rounds", 80, "measured rounds of the main and files tables")
	scalingRounds := flag.Int("scaling-rounds", 30, "measured rounds of the scaling table")
	paths := flag.String("paths", "floor,nri-gpu,nri-gpu-toolkit-layout,cdi,cdi-toolkit-layout,toolkit,nvidia-runtime", "paths of the main table besides the baseline: "+strings.Join(bench.MainPaths[1:], ",")+"; diagnostic: "+strings.Join(bench.DiagnosticPaths, ","))
	phases := flag.String("phases", "main,files,scaling,emit-cdi", "what to measure: main (paths 1-6, 1 GPU), files (libraryMode files), scaling (GPUs x capabilities), emit-cdi (emit: cdi)")
	gpus := flag.String("gpus", "1,4,8", "GPU counts of the scaling table (at most 8)")
	caps := flag.String("caps", "utility;compute,utility;all", "capability sets of the scaling table, ';'-separated")
	rt := flag.String("runtime", harness.RuntimeContainerd24, "the runtime measured: "+strings.Join(harness.Runtimes, ", ")+" (the nvidia-runtime path: containerd only)")
	nice := flag.Int("nice", -10, "nice value of the benchmark, containerd and the plugins (and so of shims, runc and hooks), to cut noise from other work on the machine; 0 leaves it alone")
	flag.Parse()
	pathList := split(*paths, ",")
	pathsGiven := false
	flag.Visit(func(f *flag.Flag) { pathsGiven = pathsGiven || f.Name == "paths" })
	if !pathsGiven && *rt == harness.RuntimeCRIO {
		// The default paths on CRI-O: nvidia-container-runtime is a
		// containerd runtime class (asking for it with -paths still fails,
		// saying so).
		pathList = slices.DeleteFunc(pathList, func(p string) bool { return p == bench.NVIDIARuntime })
	}
	if err := run(*bin, *rt, *rounds, *scalingRounds, pathList, split(*phases, ","), *gpus, split(*caps, ";"), *nice); err != nil {
		fmt.Fprintln(os.Stderr, "bench-e2e:", err)
		os.Exit(1)
	}
}

func split(s, sep string) []string {
	var out []string
	for _, f := range strings.Split(s, sep) {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func run(bin, runtime string, rounds, scalingRounds int, paths, phases []string, gpuList string, caps []string, nice int) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (it runs containerd and runc)")
	}
	if nice != 0 {
		if err := bench.Renice(0, nice); err != nil {
			return fmt.Errorf("-nice: %w", err)
		}
	}
	if !slices.Contains(harness.Runtimes, runtime) {
		return fmt.Errorf("-runtime: unknown runtime %q (valid: %s)", runtime, strings.Join(harness.Runtimes, ", "))
	}
	valid := append(append([]string(nil), bench.MainPaths[1:]...), bench.DiagnosticPaths...)
	for _, p := range paths {
		if !slices.Contains(valid, p) {
			return fmt.Errorf("-paths: unknown path %q (valid: %s)", p, strings.Join(valid, ", "))
		}
	}
	var gpus []int
	for _, g := range split(gpuList, ",") {
		n, err := strconv.Atoi(g)
		if err != nil || n < 1 || n > 8 {
			return fmt.Errorf("-gpus: %q is not a GPU count from 1 to 8", g)
		}
		gpus = append(gpus, n)
	}
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	harness.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "nri-gpu-e2e: "+format+"\n", args...) }

	want := func(p string) bool { return slices.Contains(phases, p) }
	toolkit := slices.Contains(paths, bench.Toolkit)
	mainCases := bench.MainCases(paths)
	filesCases := bench.FilesCases()
	emitCases := bench.EmitCDICases()
	scalingCases := bench.ScalingCases(gpus, caps, toolkit)
	var all []*bench.Case
	for _, p := range []struct {
		name  string
		cases []*bench.Case
	}{{"main", mainCases}, {"files", filesCases}, {"scaling", scalingCases}, {"emit-cdi", emitCases}} {
		if want(p.name) {
			all = append(all, p.cases...)
		}
	}

	env, err := bench.Setup(ctx, bench.Options{NRIGPU: bin, Nice: nice, Runtime: runtime, NVIDIARuntime: want("main") && slices.Contains(paths, bench.NVIDIARuntime)})
	if err != nil {
		return err
	}
	defer env.Close()
	if err := env.Prepare(all); err != nil {
		return err
	}

	host, _ := os.Hostname()
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("<!-- bench-e2e on %s, %d CPUs, load %s, nice %d, %s, runtime %s, runc %s, toolkit %s -->\n\n", host, numCPU(), strings.Join(strings.Fields(string(load))[:3], " "), nice, time.Now().UTC().Format(time.RFC3339), env.C.Name(), env.Tools.RuncVersion, bench.ToolkitVersion)
	if want("main") {
		fmt.Fprintf(os.Stderr, "bench-e2e: main table, %d rounds\n", rounds)
		r, err := env.Run(ctx, mainCases, rounds)
		if err != nil {
			return err
		}
		fmt.Printf("### One GPU, default capabilities (compute,utility)\n\n")
		bench.WriteTable(os.Stdout, r, bench.Floor)
		fmt.Println()
		bench.WriteLayoutChoice(os.Stdout, r) // a paragraph when the main table has nri-gpu in both layouts
		bench.WriteLayout(os.Stdout, r)       // a paragraph when the main table has nri-gpu-copy
		bench.WriteTargets(os.Stdout, r)
		fmt.Println()
	}
	if want("scaling") {
		fmt.Fprintf(os.Stderr, "bench-e2e: scaling table, %d rounds\n", scalingRounds)
		r, err := env.Run(ctx, scalingCases, scalingRounds)
		if err != nil {
			return err
		}
		fmt.Printf("### Scaling: GPUs per container and capability sets\n\n")
		bench.WriteScaling(os.Stdout, r, gpus, caps)
		fmt.Println()
	}
	if want("files") {
		if err := env.StartNRIGPU("files"); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench-e2e: libraryMode files, %d rounds\n", rounds)
		r, err := env.Run(ctx, filesCases, rounds)
		if err != nil {
			return err
		}
		fmt.Printf("### libraryMode files (one mount per library; nri-gpu restarted in this mode, measured after the tables above)\n\n")
		bench.WriteTable(os.Stdout, r, "floor (files)")
		fmt.Println()
	}
	if want("emit-cdi") {
		if err := env.StartNRIGPU(bench.EmitCDIMode); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench-e2e: emit: cdi, %d rounds\n", rounds)
		r, err := env.Run(ctx, emitCases, rounds)
		if err != nil {
			return err
		}
		fmt.Printf("### emit: cdi (nri-gpu answers with CDI device references; restarted in this mode, measured after the tables above)\n\n")
		bench.WriteTable(os.Stdout, r, bench.EmitCDIFloor)
		fmt.Println()
	}
	return nil
}

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}
