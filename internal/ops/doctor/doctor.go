// Package doctor checks a node for what nri-gpu needs, layer by layer, in
// the order a GPU reaches a container: the kernel (driver loaded, majors,
// device nodes), user space (driver libraries present and of the kernel
// module's version) and injection (the runtime's NRI enabled, its socket
// accepting, nri-gpu registered, no second GPU injector, required
// plugins). Each check gives a one-line verdict and, when it does not
// pass, the fix. A node that serves another vendor's devices (cdiImport)
// is judged by its CDI specs instead of NVIDIA's kernel module and
// libraries: the devices they define, and whether nri-gpu may serve them.
package doctor

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Status is a check's outcome.
type Status int

// Outcomes of a check.
const (
	// Pass: nothing to do.
	Pass Status = iota
	// Warn: works, but something is worth a look (see the fix).
	Warn
	// Fail: GPUs will not reach containers (or will reach them twice)
	// until fixed.
	Fail
	// Skip: not checked because an earlier check failed.
	Skip
)

func (s Status) String() string {
	return [...]string{"PASS", "WARN", "FAIL", "SKIP"}[s]
}

// Layers, in the order they are checked.
const (
	Kernel    = "kernel"
	UserSpace = "user space"
	Injection = "injection"
)

// Result is one check's verdict.
type Result struct {
	Layer   string
	Name    string
	Status  Status
	Verdict string
	// Fix says what to do; empty for a pass.
	Fix string
}

// Options say where the node's files are. Paths taken from the runtime's
// configuration are host paths and are read under Config.HostRoot.
type Options struct {
	// Config is nri-gpu's configuration (hostRoot, driverRoot...).
	Config config.Config
	// ContainerdConfig is containerd's main configuration file; empty:
	// <hostRoot>/etc/containerd/config.toml. Its imports are followed.
	ContainerdConfig string
	// CRIOConfig is CRI-O's main configuration file; empty:
	// <hostRoot>/etc/crio/crio.conf. Drop-ins are read from
	// CRIOConfig + ".d".
	CRIOConfig string
	// Socket is the NRI socket; empty: from the runtime's configuration,
	// else <hostRoot>/var/run/nri/nri.sock.
	Socket string
	// CDIDirs are where CDI specs are looked for; empty: the runtime's
	// cdi_spec_dirs, else /etc/cdi and /var/run/cdi under hostRoot.
	CDIDirs []string
	// HealthURL is nri-gpu's metrics listener ("http://127.0.0.1:9400");
	// empty: found from a running nri-gpu's --metrics-addr.
	HealthURL string
	// StatusSocket is nri-gpu's status socket; empty:
	// <hostRoot>/run/nri-gpu/status.sock.
	StatusSocket string
	// Name and Index are the plugin's registered name and index.
	Name, Index string
	// Self is this process's pid, ignored when looking for a running
	// nri-gpu; zero: none.
	Self int
	// DRACheckpoint reads the DRA driver's checkpoint in its plugin
	// directory and returns how many prepared claims it has (the DRA
	// driver's reader: this package is beside it, not above it); nil:
	// not checked.
	DRACheckpoint func(pluginDir string) (int, error)
	// DRAMadeMIG reads the DRA driver's ledger of MIG devices made on
	// demand (dra.dynamicMIG) in its plugin directory and returns how
	// many it names; nil: not checked.
	DRAMadeMIG func(pluginDir string) (int, error)
}

func (o *Options) defaults() {
	if o.Config.HostRoot == "" {
		o.Config = config.Default()
	}
	if o.ContainerdConfig == "" {
		o.ContainerdConfig = o.host("/etc/containerd/config.toml")
	}
	if o.CRIOConfig == "" {
		o.CRIOConfig = o.host("/etc/crio/crio.conf")
	}
	if o.StatusSocket == "" {
		o.StatusSocket = o.host(status.DefaultSocket)
	}
	if o.Name == "" {
		o.Name = "nri-gpu"
	}
	if o.Index == "" {
		o.Index = "10"
	}
}

// host returns where this process reads the host path p.
func (o *Options) host(p string) string { return filepath.Join(o.Config.HostRoot, p) }

// Run checks the node and returns every verdict in order.
func Run(o Options) []Result {
	o.defaults()
	var out []Result
	var snap *inventory.Snapshot
	if o.Config.CDIImport != nil {
		checkImported(&o, &out)
	} else {
		snap, _ = checkKernel(&o, &out)
		checkDeviceFiles(&o, snap, &out)
		checkUserSpace(&o, snap, &out)
		checkNVML(&o, snap, &out)
	}
	checkInjection(&o, &out)
	if o.Config.CDIImport == nil {
		checkDevChar(&o, snap, &out)
	}
	checkDevicePlugin(&o, &out)
	checkDRACheckpoint(&o, &out)
	checkDRAMadeMIG(&o, &out)
	return out
}

// OK reports whether no check failed.
func OK(results []Result) bool {
	for _, r := range results {
		if r.Status == Fail {
			return false
		}
	}
	return true
}

// Print writes one line per check, and the fix under each that did not
// pass, then a summary line.
func Print(w io.Writer, results []Result) {
	var failed, warned int
	for _, r := range results {
		fmt.Fprintf(w, "%-4s  %-10s  %-16s  %s\n", r.Status, r.Layer, r.Name, r.Verdict)
		if r.Fix != "" && r.Status != Pass {
			fmt.Fprintf(w, "      %-10s  %-16s  fix: %s\n", "", "", r.Fix)
		}
		switch r.Status {
		case Fail:
			failed++
		case Warn:
			warned++
		}
	}
	switch {
	case failed > 0:
		fmt.Fprintf(w, "%d of %d checks failed: containers will not get GPUs as asked until fixed\n", failed, len(results))
	case warned > 0:
		fmt.Fprintf(w, "all checks passed, %d with a warning\n", warned)
	default:
		fmt.Fprintln(w, "all checks passed")
	}
}

func add(out *[]Result, layer, name string, s Status, verdict, fix string) {
	*out = append(*out, Result{Layer: layer, Name: name, Status: s, Verdict: verdict, Fix: fix})
}

// firstLines joins up to n messages for a one-line verdict.
func firstLines(msgs []string, n int) string {
	if len(msgs) > n {
		return strings.Join(msgs[:n], "; ") + fmt.Sprintf("; and %d more", len(msgs)-n)
	}
	return strings.Join(msgs, "; ")
}
