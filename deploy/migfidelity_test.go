package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// fakeSMI writes an nvidia-smi that prints, for -L and mig -lci, what the
// real one prints for the MIG layout st of node n, with profile giving
// each MIG device's name.
func fakeSMI(t *testing.T, n *simnode.Node, st simnode.NVMLState, profile func(gpu, mig int, m simnode.MIG) string) string {
	t.Helper()
	var l, lci strings.Builder
	lci.WriteString("+--------------------------------------------------------------------+\n")
	lci.WriteString("| Compute instances:                                                 |\n")
	lci.WriteString("| GPU     GPU       Name             Profile   Instance   Placement  |\n")
	lci.WriteString("|       Instance                       ID        ID       Start:Size |\n")
	lci.WriteString("|         ID                                                         |\n")
	lci.WriteString("|====================================================================|\n")
	for i, g := range n.GPUs {
		fmt.Fprintf(&l, "GPU %d: %s (UUID: %s)\n", i, g.Model, g.UUID)
		if i >= len(st.GPUs) {
			continue
		}
		for j, m := range st.GPUs[i].MIG {
			p := profile(i, j, m)
			fmt.Fprintf(&l, "  MIG %-11s Device %2d: (UUID: %s)\n", p, j, simnode.MIGUUIDFor(g.UUID, m.GI, m.CI))
			fmt.Fprintf(&lci, "|   %d      %d       MIG %-12s      0         %d          0:1     |\n", i, m.GI, p, m.CI)
		}
	}
	lci.WriteString("+--------------------------------------------------------------------+\n")
	dir := t.TempDir()
	for name, text := range map[string]string{"L": l.String(), "lci": lci.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	smi := filepath.Join(dir, "nvidia-smi")
	script := fmt.Sprintf("#!/bin/sh\ncase \"$*\" in\n-L) cat %s/L;;\n\"mig -lci\") cat %s/lci;;\n*) echo unexpected \"$*\" >&2; exit 2;;\nesac\n", dir, dir)
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return smi
}

// TestMIGFidelityScript runs tools/mig-fidelity.sh against a simulated
// MIG node with an nvidia-smi that agrees, then with one that names a
// profile differently.
func TestMIGFidelityScript(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: nri-gpu inventory finds GPUs through /dev/nvidia* character devices: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 3, SwapMinors: true, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	st := simnode.MixedMIG()
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "nri-gpu")
	build := exec.Command("go", "build", "-o", bin, "./cmd/nri-gpu")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building nri-gpu: %v\n%s", err, out)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n", n.Root, n.Root)), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(smi string) (string, error) {
		cmd := exec.Command("sh", "tools/mig-fidelity.sh", "--config", cfg)
		cmd.Env = append(os.Environ(), "NRI_GPU="+bin, "NVIDIA_SMI="+smi, "PROC="+filepath.Join(n.Root, "proc"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	real := func(_, _ int, m simnode.MIG) string { return fmt.Sprintf("%dg.%dgb", m.GISlices, m.GISlices*10) }
	out, err := run(fakeSMI(t, n, st, real))
	if err != nil || !strings.HasPrefix(out, "OK: 11 MIG devices agree") {
		t.Fatalf("agreeing nvidia-smi: %v\n%s", err, out)
	}
	wrong := func(gpu, mig int, m simnode.MIG) string {
		if gpu == 1 && mig == 3 {
			return "1c.2g.20gb"
		}
		return real(gpu, mig, m)
	}
	out, err = run(fakeSMI(t, n, st, wrong))
	mig13 := simnode.MIGUUIDFor(n.GPUs[1].UUID, 13, 0)
	if err == nil || !strings.Contains(out, "only nri-gpu: dev "+mig13+" 1:3 1g.10gb") || !strings.Contains(out, "only nvidia-smi: dev "+mig13+" 1:3 1c.2g.20gb") {
		t.Errorf("disagreeing nvidia-smi: %v\n%s", err, out)
	}
}
