package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goModules are the repository's Go modules, by their go.mod.
var goModules = []string{"go.mod", "deploy/go.mod", "test/integration/go.mod", "test/e2e/go.mod"}

// goDirective is a go.mod's go line.
var goDirective = regexp.MustCompile(`(?m)^go (\d+\.\d+)(\.\d+)?\s*$`)

// TestGoVersionNamed checks that the Go version a reader is told to build
// with is the one every go.mod asks for: README's support matrix ("| Go |
// 1.N or later"), CONTRIBUTING.md ("needs Go 1.N or later") and the
// Dockerfile's build stage (golang:1.N).
func TestGoVersionNamed(t *testing.T) {
	want := ""
	for _, m := range goModules {
		data, err := os.ReadFile(filepath.Join("..", m))
		if err != nil {
			t.Fatal(err)
		}
		g := goDirective.FindSubmatch(data)
		if g == nil {
			t.Fatalf("%s: no go directive", m)
		}
		switch v := string(g[1]); {
		case want == "":
			want = v
		case v != want:
			t.Errorf("%s asks for go %s, %s for go %s: the docs name one version", m, v, goModules[0], want)
		}
	}
	for _, c := range []struct{ file, pattern string }{
		{"README.md", `(?m)^\| Go \| (\d+\.\d+) or later`},
		{"CONTRIBUTING.md", `needs Go (\d+\.\d+) or later`},
		{"deploy/Dockerfile", `(?m)^FROM (?:--platform=\S+ )?golang:(\d+\.\d+)-`},
	} {
		data, err := os.ReadFile(filepath.Join("..", c.file))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(c.pattern).FindAllSubmatch(data, -1)
		if len(m) == 0 {
			t.Errorf("%s: no Go version found (%s): the test and the file disagree on its wording", c.file, c.pattern)
		}
		for _, g := range m {
			if got := string(g[1]); got != want {
				t.Errorf("%s names Go %s; go.mod asks for go %s", c.file, strings.TrimSpace(got), want)
			}
		}
	}
}
