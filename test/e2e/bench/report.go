package bench

import (
	"fmt"
	"io"
	"slices"
)

// MainCases are the cases of the main table: one GPU with the default
// capabilities on each of paths (a subset of MainPaths).
func MainCases(paths []string) []*Case {
	var cs []*Case
	for _, p := range MainPaths {
		if !slices.Contains(paths, p) && p != Baseline {
			continue
		}
		c := &Case{Name: p, Path: p, GPUs: 1, Mode: "auto"}
		switch p {
		case Baseline:
			c.GPUs = 0
		case NRIGPUToolkitLayout:
			c.Path, c.Mode = NRIGPU, ToolkitLayoutMode
		case CDIToolkitLayout:
			c.Path, c.Mode = CDI, ToolkitLayoutMode
		}
		cs = append(cs, c)
	}
	for p, strip := range map[string]string{FloorDevices: "mounts", FloorLibDir: "files"} {
		if slices.Contains(paths, p) {
			cs = append(cs, &Case{Name: p, Path: Floor, GPUs: 1, Mode: "auto", Strip: strip})
		}
	}
	if slices.Contains(paths, FloorFirmware) {
		cs = append(cs, &Case{Name: FloorFirmware, Path: Floor, GPUs: 1, Mode: FirmwareMountMode})
	}
	if slices.Contains(paths, FloorToolkitLayout) {
		cs = append(cs, &Case{Name: FloorToolkitLayout, Path: Floor, GPUs: 1, Mode: ToolkitLayoutMode})
	}
	if slices.Contains(paths, NRIGPUCopy) {
		cs = append(cs, &Case{Name: NRIGPUCopy, Path: NRIGPU, GPUs: 1, Mode: CopyMode})
	}
	slices.SortStableFunc(cs, func(a, b *Case) int { return order(a.Name) - order(b.Name) })
	return cs
}

// order is the report order of the main table's rows.
func order(name string) int {
	for i, p := range []string{Baseline, FloorDevices, FloorLibDir, Floor, FloorToolkitLayout, FloorFirmware, NRIGPU, NRIGPUToolkitLayout, NRIGPUCopy, CDI, CDIToolkitLayout, Toolkit, NVIDIARuntime} {
		if p == name {
			return i
		}
	}
	return 99
}

// EmitCDIFloor is the floor of the emit-cdi phase: emit: cdi uses the
// toolkit layout (a CDI spec can only replace PATH).
const EmitCDIFloor = "floor (layout: toolkit)"

// EmitCDICases measure nri-gpu with emit: cdi (CDI device references that
// containerd resolves from nri-gpu's generated spec), beside the baseline,
// the floor and containerd's CDI of nri-gpu's edits, all in the toolkit
// layout that emit: cdi uses.
func EmitCDICases() []*Case {
	return []*Case{
		{Name: Baseline, Path: Baseline},
		{Name: EmitCDIFloor, Path: Floor, GPUs: 1, Mode: ToolkitLayoutMode},
		{Name: "nri-gpu (emit: cdi)", Path: NRIGPU, GPUs: 1, Mode: EmitCDIMode},
		{Name: "cdi (layout: toolkit)", Path: CDI, GPUs: 1, Mode: ToolkitLayoutMode},
	}
}

// FilesCases measure libraryMode files (one mount per library): nri-gpu
// restarted with that mode, its floor and containerd's CDI of the same
// edits, beside the baseline.
func FilesCases() []*Case {
	return []*Case{
		{Name: Baseline, Path: Baseline},
		{Name: "floor (files)", Path: Floor, GPUs: 1, Mode: "files"},
		{Name: "nri-gpu (files)", Path: NRIGPU, GPUs: 1, Mode: "files"},
		{Name: "cdi (files)", Path: CDI, GPUs: 1, Mode: "files"},
	}
}

// ScalingCases are nri-gpu for every GPU count and capability set, and the
// toolkit path for every GPU count (its spec injects every driver file
// whatever the capabilities), beside the baseline.
func ScalingCases(gpus []int, caps []string, toolkit bool) []*Case {
	cs := []*Case{{Name: Baseline, Path: Baseline}}
	for _, g := range gpus {
		for _, c := range caps {
			cs = append(cs, &Case{Name: scalingName(NRIGPU, g, c), Path: NRIGPU, GPUs: g, Caps: c, Mode: "auto"})
		}
		if toolkit {
			cs = append(cs, &Case{Name: scalingName(Toolkit, g, ""), Path: Toolkit, GPUs: g, Mode: "auto"})
		}
	}
	return cs
}

func scalingName(path string, gpus int, caps string) string {
	if caps == "" {
		return fmt.Sprintf("%s %dgpu", path, gpus)
	}
	return fmt.Sprintf("%s %dgpu %s", path, gpus, caps)
}

var pathLabels = map[string]string{
	Baseline:            "1. no GPU request (baseline)",
	Floor:               "2. NRI plugin returning a precomputed adjustment (floor)",
	NRIGPU:              "3. nri-gpu, default layout (/usr/local/nvidia/{lib64,bin}: one directory mount each)",
	NRIGPUToolkitLayout: "3c. nri-gpu, layout: toolkit (binaries at /usr/bin, one mount each)",
	CDI:                 "4. the runtime's own CDI, same edits as nri-gpu (default layout)",
	CDIToolkitLayout:    "4b. the runtime's own CDI, same edits as nri-gpu with layout: toolkit",
	Toolkit:             "5. toolkit path: nvidia-ctk-shaped CDI spec + 4 nvidia-cdi-hook hooks",
	NVIDIARuntime:       "6. nvidia-container-runtime " + ToolkitVersion + " (CDI mode) wrapping runc",
	FloorDevices:        "2a. floor without mounts (device nodes only)",
	FloorLibDir:         "2b. floor with the library directory only (device nodes + library directory, no binaries)",
	FloorFirmware:       "2c. floor with firmware: mount (+ the GSP firmware directory)",
	FloorToolkitLayout:  "2d. floor with layout: toolkit (binaries at /usr/bin, one mount each)",
	NRIGPUCopy:          "3b. nri-gpu, library cache through a second mount (libraryCacheMount: copies, not hard links)",
}

func label(c *Case) string {
	if l, ok := pathLabels[c.Name]; ok {
		return l
	}
	return c.Name
}

// WriteTable writes the markdown table of a phase: medians (p90) of each
// time and the per-round paired ratios of create+start to the baseline
// and, when given, to the floor case.
func WriteTable(w io.Writer, r *Result, floor string) {
	fmt.Fprintf(w, "| path | create p50 | start p50 | create+start p50 (p10–p90) | total p50 (p90) | create+start / baseline | create+start / floor | total / baseline | what the container got |\n")
	fmt.Fprintf(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, c := range r.Cases {
		cs, tot := r.Stat(c.Name, CreateStart), r.Stat(c.Name, Total)
		rb, rb10, rb90 := r.Ratio(c.Name, Baseline, CreateStart)
		tb, _, _ := r.Ratio(c.Name, Baseline, Total)
		rf := "–"
		if floor != "" && r.Samples[floor] != nil {
			f, f10, f90 := r.Ratio(c.Name, floor, CreateStart)
			rf = fmt.Sprintf("%.3f [%.3f–%.3f]", f, f10, f90)
		}
		fmt.Fprintf(w, "| %s | %.1f ms | %.1f ms | %.1f ms (%.1f–%.1f) | %.1f ms (%.1f) | %.3f [%.3f–%.3f] | %s | %.3f | %s |\n",
			label(c), r.Stat(c.Name, Create).P50, r.Stat(c.Name, Start).P50, cs.P50, cs.P10, cs.P90, tot.P50, tot.P90,
			rb, rb10, rb90, rf, tb, r.Info[c.Name])
	}
	n := 0
	for _, s := range r.Samples {
		n = max(n, len(s))
	}
	fmt.Fprintf(w, "\n%d rounds; ratios are medians of per-round ratios, with the 95%% confidence interval of that median in brackets.\n", n)
}

// WriteScaling writes the scaling table: create+start p50 and its paired
// ratio to the baseline for nri-gpu per GPU count and capability set, and
// for the toolkit path per GPU count.
func WriteScaling(w io.Writer, r *Result, gpus []int, caps []string) {
	fmt.Fprintf(w, "| GPUs | capabilities | nri-gpu create+start p50 | nri-gpu / baseline | toolkit create+start p50 | toolkit / baseline | nri-gpu / toolkit (paired) | nri-gpu got |\n")
	fmt.Fprintf(w, "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, g := range gpus {
		tk := scalingName(Toolkit, g, "")
		for _, c := range caps {
			n := scalingName(NRIGPU, g, c)
			nb, _, _ := r.Ratio(n, Baseline, CreateStart)
			tkCell, tkRatio, vs := "–", "–", "–"
			if r.Samples[tk] != nil {
				t, _, _ := r.Ratio(tk, Baseline, CreateStart)
				v, _, _ := r.Ratio(n, tk, CreateStart)
				tkCell = fmt.Sprintf("%.1f ms", r.Stat(tk, CreateStart).P50)
				tkRatio, vs = fmt.Sprintf("%.3f", t), fmt.Sprintf("%.3f", v)
			}
			fmt.Fprintf(w, "| %d | %s | %.1f ms | %.3f | %s | %s | %s | %s |\n", g, c, r.Stat(n, CreateStart).P50, nb, tkCell, tkRatio, vs, r.Info[n])
		}
	}
	fmt.Fprintf(w, "\nbaseline create+start p50: %.1f ms. The toolkit's spec is the same for every capability set (CDI mode mounts every driver file); its row is measured once per GPU count.\n", r.Stat(Baseline, CreateStart).P50)
}

// WriteLayoutChoice writes, when the main table has nri-gpu in both
// layouts, the paired ratios of the toolkit layout (binaries at /usr/bin)
// over the default layout (binaries in /usr/local/nvidia/bin), per phase.
func WriteLayoutChoice(w io.Writer, r *Result) {
	if r.Samples[NRIGPU] == nil || r.Samples[NRIGPUToolkitLayout] == nil {
		return
	}
	fmt.Fprintf(w, "layout: toolkit (nri-gpu-toolkit-layout) over the default layout (nri-gpu), paired p50 [95%% CI] over %d rounds:\n\n", len(r.Samples[NRIGPU]))
	for _, m := range []struct {
		name string
		m    Metric
	}{{"create", Create}, {"start", Start}, {"create+start", CreateStart}, {"total", Total}} {
		v, lo, hi := r.Ratio(NRIGPUToolkitLayout, NRIGPU, m.m)
		fmt.Fprintf(w, "- %s: %.3f [%.3f–%.3f]\n", m.name, v, lo, hi)
	}
	fmt.Fprintln(w)
}

// WriteLayout writes, when the main table has both nri-gpu rows, the
// paired ratios of nri-gpu with its library cache of copies (CopyMode)
// over nri-gpu with hard links (the default), per phase.
func WriteLayout(w io.Writer, r *Result) {
	if r.Samples[NRIGPU] == nil || r.Samples[NRIGPUCopy] == nil {
		return
	}
	fmt.Fprintf(w, "Library cache of copies (nri-gpu-copy) over hard links (nri-gpu), paired p50 [95%% CI] over %d rounds:\n\n", len(r.Samples[NRIGPU]))
	for _, m := range []struct {
		name string
		m    Metric
	}{{"create", Create}, {"start", Start}, {"create+start", CreateStart}, {"total", Total}} {
		v, lo, hi := r.Ratio(NRIGPUCopy, NRIGPU, m.m)
		fmt.Fprintf(w, "- %s: %.3f [%.3f–%.3f]\n", m.name, v, lo, hi)
	}
	fmt.Fprintln(w)
}

// WriteTargets checks the project's start-latency targets (see
// docs/benchmarks.md) against the main table and writes one line per target: met when the whole 95% confidence
// interval of the paired median ratio is within the target, missed when it
// is all outside, and not resolved otherwise.
func WriteTargets(w io.Writer, r *Result) {
	have := func(n string) bool { return r.Samples[n] != nil }
	line := func(what, ref string, limit float64, strict bool, m Metric) {
		if !have(NRIGPU) || !have(ref) {
			return
		}
		v, lo, hi := r.Ratio(NRIGPU, ref, m)
		within := func(x float64) bool { return x < limit || !strict && x == limit }
		verdict := "not resolved by this run (the interval straddles the target)"
		switch {
		case len(r.Samples[ref]) < 20:
			verdict = "too few rounds to judge"
		case within(hi):
			verdict = "met"
		case !within(lo):
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "- %s: %.3f [%.3f–%.3f], %s\n", what, v, lo, hi, verdict)
	}
	line("target: nri-gpu within 2% of the floor (create+start, paired p50)", Floor, 1.02, false, CreateStart)
	line("target: nri-gpu below the runtime's CDI of the same files", CDI, 1, true, CreateStart)
	if have(NRIGPU) && have(CDI) && len(r.Samples[CDI]) >= 20 {
		// The weaker goal: not slower, which a run shows unless its
		// whole interval is above 1.
		v, lo, hi := r.Ratio(NRIGPU, CDI, CreateStart)
		verdict := "met (the interval reaches 1 or below)"
		if lo > 1 {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "- target: nri-gpu no slower than the runtime's CDI of the same files: %.3f [%.3f–%.3f], %s\n", v, lo, hi, verdict)
	}
	// nri-gpu, the floor and containerd's CDI hand runc the same spec
	// (the smoke test checks it), so they can differ only while the
	// container is created; the create phase alone shows that difference
	// without the noise of runc's start.
	line("target, create phase alone: nri-gpu within 2% of the floor", Floor, 1.02, false, Create)
	line("target, create phase alone: nri-gpu below the runtime's CDI", CDI, 1, true, Create)
	line("target: nri-gpu below nvidia-container-runtime", NVIDIARuntime, 1, true, CreateStart)
	line("target: nri-gpu <= 1.03x no injection", Baseline, 1.03, false, CreateStart)
	if have(NRIGPUToolkitLayout) && have(CDIToolkitLayout) {
		v, lo, hi := r.Ratio(NRIGPUToolkitLayout, CDIToolkitLayout, CreateStart)
		fmt.Fprintf(w, "- layout: toolkit, nri-gpu over the runtime's CDI of the same files: %.3f [%.3f–%.3f]\n", v, lo, hi)
	}
	line("target: nri-gpu <= 0.75x the toolkit path", Toolkit, 0.75, false, CreateStart)
	line("target: nri-gpu below nvidia-container-runtime", NVIDIARuntime, 1, true, CreateStart)
}
