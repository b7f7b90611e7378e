package suite

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// installCommands are docs/install.md's Kubernetes commands, exactly as
// the cluster phase runs them (installCommand), with the doc's
// placeholders <node>, <pod> and <tag> filled in, deploy/kubernetes
// replaced by the test overlay of it and the chart's lint, template and
// install given the suite's values file (the simulated nodes' paths).
// TestInstallDocCommands checks that the doc shows these and no other.
var installCommands = map[string]string{
	"label":     "kubectl label node <node> nvidia.com/gpu.present=true",
	"apply":     "kubectl apply -k deploy/kubernetes",
	"status":    "kubectl -n nri-gpu rollout status daemonset/nri-gpu --timeout=3m",
	"pods":      "kubectl -n nri-gpu get pods -o wide",
	"gpus":      `kubectl get nodes -o 'custom-columns=NODE:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu'`,
	"doctor":    "kubectl -n nri-gpu exec <pod> -- nri-gpu doctor --config /etc/nri-gpu/config.yaml --socket /var/run/nri/nri.sock --status-socket /run/nri-gpu/status.sock",
	"table":     "kubectl -n nri-gpu exec <pod> -- nri-gpu status",
	"delete":    "kubectl delete -k deploy/kubernetes",
	"lint":      "helm lint deploy/helm/nri-gpu",
	"template":  "helm template nri-gpu deploy/helm/nri-gpu -n nri-gpu",
	"install":   "helm install nri-gpu deploy/helm/nri-gpu -n nri-gpu --create-namespace",
	"restart":   "kubectl -n nri-gpu rollout restart daemonset/nri-gpu",
	"upgrade":   "helm upgrade nri-gpu deploy/helm/nri-gpu -n nri-gpu --reuse-values --set image.tag=<tag>",
	"drain":     "kubectl drain <node> --ignore-daemonsets --delete-emptydir-data --timeout=2m",
	"uncordon":  "kubectl uncordon <node>",
	"uninstall": "helm uninstall nri-gpu -n nri-gpu",
	// On a node, after the uninstall (cleanupCommand).
	"cleanup-dry-run": "sudo nri-gpu cleanup --config " + docCleanupConfig + " --dry-run",
	"cleanup":         "sudo nri-gpu cleanup --config " + docCleanupConfig,
}

// docCleanupConfig is the configuration docs/install.md writes for
// nri-gpu cleanup after a DaemonSet uninstall (the record's host
// directory); the cluster phase gives its own (cleanupCommand).
const docCleanupConfig = "/tmp/nri-gpu-cleanup.yaml"

// cleanupCommand is the argv of installCommands[name], an nri-gpu
// cleanup command, as the cluster phase runs it in a node's mount
// namespace: without sudo (the suite is root), bin as nri-gpu (the
// checkout's bin/nri-gpu, which an operator copies onto the node), config
// for docCleanupConfig.
func cleanupCommand(name, bin, config string) []string {
	words := shellWords(installCommands[name])
	if len(words) > 0 && words[0] == "sudo" {
		words = words[1:]
	}
	for i, w := range words {
		switch {
		case i == 0 && w == "nri-gpu":
			words[i] = bin
		case w == docCleanupConfig:
			words[i] = config
		}
	}
	return words
}

// shellWords splits a command line as the shell does for what the doc
// uses: words separated by spaces, single quotes kept literally.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// installCommand is the argv of installCommands[name] as the cluster
// phase runs it: placeholders from fill, deploy/kubernetes as overlay,
// the chart in this checkout, values for lint, template and install.
func installCommand(name string, fill map[string]string, overlay, chart, values string) []string {
	words := shellWords(installCommands[name])
	for i, w := range words {
		for k, v := range fill {
			w = strings.ReplaceAll(w, "<"+k+">", v)
		}
		switch w {
		case "deploy/kubernetes":
			w = overlay
		case "deploy/helm/nri-gpu":
			w = chart
		}
		words[i] = w
	}
	if name == "lint" || name == "template" || name == "install" {
		words = append(words, "-f", values)
	}
	return words
}

// docKubernetesCommands are the kubectl, helm and sudo nri-gpu lines of
// the shell blocks in docs/install.md's "## Kubernetes" section, comments
// removed.
func docKubernetesCommands(t *testing.T) []string {
	data, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Kubernetes\n")
	if !ok {
		t.Fatal("docs/install.md: no ## Kubernetes section")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var out []string
	inBlock := false
	for _, l := range strings.Split(section, "\n") {
		if strings.HasPrefix(l, "```") {
			inBlock = !inBlock
			continue
		}
		if !inBlock {
			continue
		}
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "kubectl ") || strings.HasPrefix(l, "helm ") || strings.HasPrefix(l, "sudo nri-gpu ") {
			out = append(out, l)
		}
	}
	return out
}

// TestInstallDocCommands checks that docs/install.md's Kubernetes
// commands are the cluster phase's (installCommands), no more, no fewer.
func TestInstallDocCommands(t *testing.T) {
	doc := docKubernetesCommands(t)
	var suite []string
	for _, c := range installCommands {
		suite = append(suite, c)
	}
	sort.Strings(doc)
	sort.Strings(suite)
	doc = slices.Compact(doc)
	for _, c := range suite {
		if !slices.Contains(doc, c) {
			t.Errorf("the cluster phase runs %q; docs/install.md's Kubernetes section does not show it", c)
		}
	}
	for _, c := range doc {
		if !slices.Contains(suite, c) {
			t.Errorf("docs/install.md shows %q; the cluster phase does not run it (installCommands)", c)
		}
	}
	if got := shellWords(installCommands["gpus"]); len(got) != 5 || got[4] != `custom-columns=NODE:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu` {
		t.Errorf("shellWords: %q", got)
	}
}
