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

// checkDRAMadeMIG checks, when dra.dynamicMIG lists GPUs, that the DRA
// driver's ledger of the MIG devices it made on demand (dynamic-mig.json
// in dra.pluginDir, Options.DRAMadeMIG) reads: the driver does not start
// with one it cannot read, since it would not know which GPU instances
// are its claims'. Without dra.dynamicMIG, no line.
func checkDRAMadeMIG(o *Options, out *[]Result) {
	const name = "DRA MIG made on demand"
	if !o.Config.DRA.Enabled || !o.Config.DRA.DynamicMIG.Enabled() {
		return
	}
	if o.DRAMadeMIG == nil {
		add(out, Injection, name, Skip, "not checked: this doctor cannot read the ledger of MIG devices made on demand", "")
		return
	}
	dir := o.Config.DRA.PluginDir
	file := filepath.Join(dir, "dynamic-mig.json")
	n, err := o.DRAMadeMIG(dir)
	if err != nil {
		add(out, Injection, name, Fail, err.Error()+": the DRA driver does not start without it (it would not know which GPU instances its claims hold)",
			"drain the node of pods with claims of dra.dynamicMIG's MIG devices, destroy the GPU instances on those GPUs (nvidia-smi mig -dci, then -dgi), then move "+file+" away")
		return
	}
	add(out, Injection, name, Pass, fmt.Sprintf("%s reads: %d MIG devices made on demand (a prepared claim's each, or destroyed at the next start)", file, n), "")
}
