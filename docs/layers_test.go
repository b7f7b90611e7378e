package docs

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/nri-gpu/nri-gpu"

// layersMarker is the line of docs/design.md after which the package
// layers are drawn, as a fenced block: top to bottom, one row a line,
// package names separated by single spaces, then two or more spaces and a
// description. Packages under internal/ are drawn without that prefix.
const layersMarker = "<!-- package layers: top to bottom; a package imports only packages of lower rows (packages under internal/ without that prefix) -->"

// TestPackageLayers checks the product's imports against the drawing of
// its package layers in docs/design.md: every package is drawn once, and
// imports only packages of lower rows. The drawing cannot drift from the
// code, and no package imports one above it.
func TestPackageLayers(t *testing.T) {
	data, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := parseLayers(string(data))
	if err != nil {
		t.Fatal(err)
	}
	row := map[string]int{}
	for i, r := range rows {
		for _, p := range r {
			if _, dup := row[p]; dup {
				t.Errorf("design.md draws %s twice", p)
			}
			row[p] = i
		}
	}
	imports, err := productImports("..")
	if err != nil {
		t.Fatal(err)
	}
	for pkg, deps := range imports {
		r, ok := row[pkg]
		if !ok {
			t.Errorf("package %s is not drawn in design.md's package layers", pkg)
			continue
		}
		for _, d := range deps {
			if dr, ok := row[d]; ok && dr <= r {
				t.Errorf("%s imports %s, which design.md draws %s it", pkg, d, map[bool]string{true: "beside", false: "above"}[dr == r])
			}
		}
	}
	for p := range row {
		if _, ok := imports[p]; !ok {
			t.Errorf("design.md draws %s, which is no package of the product", p)
		}
	}
}

// folderRanks are the product's folders from the bottom up: a package
// imports only packages of its own folder's rank or a lower one, so that
// a folder's name says where its packages stand (no package of the node's
// state imports one of the request path, say). Within a rank, the drawing
// in design.md decides.
var folderRanks = [][]string{
	{"inventory"},
	{"adjust", "nodestate"},
	{"requestpath"},
	{"kubelet", "ops"},
	{"plugin"},
	{"cmd"},
}

// folderRank returns the rank of the folder that holds pkg (a path as
// productImports gives it), or -1 for a folder folderRanks does not name.
func folderRank(pkg string) int {
	top, _, _ := strings.Cut(pkg, "/")
	for i, r := range folderRanks {
		if slices.Contains(r, top) {
			return i
		}
	}
	return -1
}

// TestFolderLayers checks that no package imports one of a folder ranked
// above its own (folderRanks), and that every package is in a ranked
// folder.
func TestFolderLayers(t *testing.T) {
	imports, err := productImports("..")
	if err != nil {
		t.Fatal(err)
	}
	for pkg, deps := range imports {
		r := folderRank(pkg)
		if r < 0 {
			t.Errorf("package %s is in a folder that folderRanks does not name", pkg)
			continue
		}
		for _, d := range deps {
			if dr := folderRank(d); dr > r {
				t.Errorf("%s imports %s, whose folder stands above its own", pkg, d)
			}
		}
	}
}

// TestParseLayers checks the drawing's parser on a small case.
func TestParseLayers(t *testing.T) {
	doc := "x\n" + layersMarker + "\n```text\na b   top\nc     bottom\n```\n"
	rows, err := parseLayers(doc)
	if err != nil || len(rows) != 2 || !slices.Equal(rows[0], []string{"a", "b"}) || !slices.Equal(rows[1], []string{"c"}) {
		t.Errorf("parseLayers = %q, %v", rows, err)
	}
	if _, err := parseLayers("no marker"); err == nil {
		t.Error("a document without the marker parsed")
	}
}

// parseLayers returns the rows of packages drawn after layersMarker.
func parseLayers(doc string) ([][]string, error) {
	_, after, ok := strings.Cut(doc, layersMarker)
	if !ok {
		return nil, fmt.Errorf("no line %q", layersMarker)
	}
	lines := strings.Split(after, "\n")
	var rows [][]string
	in := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "```") && !in:
			in = true
		case strings.HasPrefix(l, "```"):
			if len(rows) == 0 {
				return nil, fmt.Errorf("the package layers are empty")
			}
			return rows, nil
		case in && strings.TrimSpace(l) != "":
			names, _, _ := strings.Cut(l, "  ")
			rows = append(rows, strings.Fields(names))
		}
	}
	return nil, fmt.Errorf("the package layers' block does not end")
}

// productImports returns, for each package of the product module under
// root (not its tests, nor test/ and docs/), the module's packages it
// imports, as paths relative to the module.
func productImports(root string) (map[string][]string, error) {
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "test" || rel == "docs" || rel == "deploy" || strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		pkg := strings.TrimPrefix(filepath.ToSlash(filepath.Dir(rel)), "internal/")
		if _, ok := out[pkg]; !ok {
			out[pkg] = nil
		}
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			if dep, ok := strings.CutPrefix(ip, module+"/"); ok && !slices.Contains(out[pkg], strings.TrimPrefix(dep, "internal/")) {
				dep = strings.TrimPrefix(dep, "internal/")
				out[pkg] = append(out[pkg], dep)
			}
		}
		return nil
	})
	return out, err
}
