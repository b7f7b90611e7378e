package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// simConfig generates a simulated 2-GPU node (device nodes as plain files)
// under dir and writes a configuration for it, with the library cache and
// the /dev/char links on: what nri-gpu run writes on a node once it has
// discovered it.
func simConfig(t *testing.T, dir string) (*simnode.Node, string) {
	t.Helper()
	n, err := simnode.Generate(filepath.Join(dir, "node"), simnode.Options{NumGPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	data := "hostRoot: " + n.Root + "\ndriverRoot: " + n.Root + "\nlibraryMode: directory\ndevCharLinks:\n  enabled: true\n"
	if err := os.WriteFile(cfg, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return n, cfg
}

// TestRunRefusesBadFlagsFirst: nri-gpu run refuses a bad flag value with a
// usage error (exit 2) that names the flag, the value and what is valid,
// before it discovers the node: the library cache and the /dev/char links
// are not made.
func TestRunRefusesBadFlagsFirst(t *testing.T) {
	dir := t.TempDir()
	n, cfg := simConfig(t, dir)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"one-digit index", []string{"--idx", "5"}, `--idx: "5" is not a plugin index (valid: two digits, 00 to 99)`},
		{"index not digits", []string{"--idx", "abc"}, `--idx: "abc" is not a plugin index (valid: two digits, 00 to 99)`},
		{"three digits", []string{"--idx", "100"}, `--idx: "100" is not a plugin index`},
		{"unknown level", []string{"--log-level", "verbose"}, `--log-level: "verbose" is not a level (valid: trace, debug, info, warning, error, fatal, panic)`},
		{"unknown format", []string{"--log-format", "xml"}, `--log-format: "xml" is not a format (valid: text, json)`},
		{"metrics address", []string{"--metrics-addr", "nonsense"}, `--metrics-addr: "nonsense" is not HOST:PORT or PORT`},
		{"metrics port", []string{"--metrics-addr", ":99999"}, `port "99999" must be a number from 0 to 65535`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"run", "--config", cfg, "--socket", filepath.Join(dir, "none.sock"), "--status-socket", ""}, tc.args...)
			if code := Main(args, &stdout, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2 (usage)", code)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr does not say %q:\n%s", tc.want, stderr.String())
			}
			for _, p := range []string{"var/lib/nri-gpu", "dev/char", "run/nri-gpu"} {
				if _, err := os.Stat(n.HostPath(p)); err == nil {
					t.Errorf("%s was made before the flags were checked", p)
				}
			}
		})
	}
}

// TestMPSRefusesBadLogFlags: nri-gpu mps checks the same log flags.
func TestMPSRefusesBadLogFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"mps", "--log-level", "loud"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `--log-level: "loud" is not a level (valid: trace,`) {
		t.Errorf("exit %d:\n%s", code, stderr.String())
	}
}

// TestLogFormatJSON: --log-format json writes one JSON object per line
// (logrus.JSONFormatter), with the level, the message and the fields.
func TestLogFormatJSON(t *testing.T) {
	lf := logFlags{level: ptr("info"), format: ptr("json")}
	var out bytes.Buffer
	log, err := lf.logger(&out)
	if err != nil {
		t.Fatal(err)
	}
	log.WithField("pod", "p").Warn("request refused")
	var line map[string]any
	if err := json.Unmarshal(out.Bytes(), &line); err != nil {
		t.Fatalf("not JSON: %v: %s", err, out.String())
	}
	if line["level"] != "warning" || line["msg"] != "request refused" || line["pod"] != "p" || line["time"] == nil {
		t.Errorf("line %v", line)
	}
}

// TestCDIGenerateNamesTarget: cdi generate -o into a missing directory
// names the target and its directory, never a temporary file, and makes
// nothing.
func TestCDIGenerateNamesTarget(t *testing.T) {
	dir := t.TempDir()
	n, cfg := simConfig(t, dir)
	target := filepath.Join(dir, "missing", "x.json")
	var stdout, stderr bytes.Buffer
	code := Main([]string{"cdi", "generate", "--config", cfg, "-o", target}, &stdout, &stderr)
	want := "-o " + target + ": directory " + filepath.Dir(target) + ": no such file or directory"
	if code != 2 || !strings.Contains(stderr.String(), want) || strings.Contains(stderr.String(), ".nri-gpu-cdi-") {
		t.Errorf("exit %d, stderr:\n%s\nwant %q", code, stderr.String(), want)
	}
	if _, err := os.Stat(n.HostPath("var/lib/nri-gpu")); err == nil {
		t.Error("the library cache was made before -o was checked")
	}
	// A directory that exists but cannot take the file (a file stands
	// where the target's directory should be).
	blocker := filepath.Join(dir, "file")
	os.WriteFile(blocker, nil, 0o644)
	stderr.Reset()
	code = Main([]string{"cdi", "generate", "--config", cfg, "-o", filepath.Join(blocker, "x.json")}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), blocker+" is not a directory") {
		t.Errorf("exit %d, stderr:\n%s", code, stderr.String())
	}
	// And a good target gets the spec (from a node with device nodes).
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root for the rest: a spec needs real device nodes (mknod): %v", err)
	}
	n, err := simnode.Generate(filepath.Join(dir, "real"), simnode.Options{NumGPUs: 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg = filepath.Join(dir, "real.yaml")
	os.WriteFile(cfg, []byte("hostRoot: "+n.Root+"\ndriverRoot: "+n.Root+"\n"), 0o644)
	good := filepath.Join(dir, "x.json")
	stderr.Reset()
	if code := Main([]string{"cdi", "generate", "--config", cfg, "-o", good}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
	if data, err := os.ReadFile(good); err != nil || !bytes.Contains(data, []byte("nvidia.com/gpu")) {
		t.Errorf("spec %v: %s", err, data)
	}
}

func ptr[T any](v T) *T { return &v }
