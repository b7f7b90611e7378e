package doctor

import (
	"fmt"
	"path/filepath"
)

// checkDRACheckpoint checks, when the configuration turns the DRA driver
// on (dra.enabled), that its checkpoint of prepared claims in
// dra.pluginDir reads (Options.DRACheckpoint): one that cannot be read
// (truncated, of a newer nri-gpu's version after a rollback) keeps every
// GPU the driver offers held, and nri-gpu not ready, until it does.
// Without dra.enabled there is nothing to check, and no line.
func checkDRACheckpoint(o *Options, out *[]Result) {
	const name = "DRA checkpoint"
	if !o.Config.DRA.Enabled {
		return
	}
	if o.DRACheckpoint == nil {
		add(out, Injection, name, Skip, "not checked: this doctor cannot read the DRA checkpoint", "")
		return
	}
	// pluginDir is a path in nri-gpu's own file system (the DaemonSet
	// mounts the host's directory at the same path), not one under
	// hostRoot.
	dir := o.Config.DRA.PluginDir
	n, err := o.DRACheckpoint(dir)
	if err != nil {
		add(out, Injection, name, Fail, err.Error()+": the DRA driver's prepared claims are unknown, so nri-gpu holds every GPU it offers and is not ready",
			fmt.Sprintf("a version newer than this nri-gpu's: run the nri-gpu that wrote it again; a damaged file: drain the node of pods with claims of the driver, "+
				"then move %s away (the kubelet prepares the claims of the pods that start again)", filepath.Join(dir, "checkpoint.json")))
		return
	}
	add(out, Injection, name, Pass, fmt.Sprintf("%s reads: %d prepared claims", filepath.Join(dir, "checkpoint.json"), n), "")
}
