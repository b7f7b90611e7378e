// Command runc-clamp runs runc for CRI-O on the e2e cluster's nodes, after
// making the OCI spec it is given fit this machine the way containerd's
// settings do for containerd: a negative process.oomScoreAdj becomes 0
// (containerd's restrict_oom_score_adj; the machine refuses a negative
// oom_score_adj even to root, and the kubelet asks -997 for
// system-node-critical pods such as nri-gpu's), and
// linux.resources.hugepageLimits are dropped when no cgroup v1 hugetlb
// hierarchy is mounted (this hybrid machine has hugetlb only in the
// unified hierarchy: CRI-O sees the controller and passes the kubelet's
// limits, runc's v1 manager cannot apply them; containerd leaves them out).
// Usage: runc-clamp RUNC [runc arguments...]; the bundle's config.json
// (--bundle, -b) or the process file (--process, -p) is edited in place.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: runc-clamp RUNC [args...]")
		os.Exit(2)
	}
	runc, args := os.Args[1], os.Args[2:]
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--bundle", "-b":
			if err := edit(filepath.Join(args[i+1], "config.json"), true); err != nil {
				fmt.Fprintln(os.Stderr, "runc-clamp:", err)
				os.Exit(1)
			}
		case "--process", "-p":
			if err := edit(args[i+1], false); err != nil {
				fmt.Fprintln(os.Stderr, "runc-clamp:", err)
				os.Exit(1)
			}
		}
	}
	err := syscall.Exec(runc, append([]string{runc}, args...), os.Environ())
	fmt.Fprintln(os.Stderr, "runc-clamp: exec", runc+":", err)
	os.Exit(1)
}

// edit clamps the oomScoreAdj of a spec (spec: its process) or of a
// process file, and drops a spec's hugepage limits without a v1 hugetlb.
func edit(path string, spec bool) error {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	proc := doc
	if spec {
		proc, _ = doc["process"].(map[string]any)
		if linux, ok := doc["linux"].(map[string]any); ok {
			if res, ok := linux["resources"].(map[string]any); ok {
				if _, err := os.Stat("/sys/fs/cgroup/hugetlb"); err != nil {
					delete(res, "hugepageLimits")
				}
			}
		}
	}
	if v, ok := proc["oomScoreAdj"].(float64); ok && v < 0 {
		proc["oomScoreAdj"] = 0
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o600)
}
