package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// kindsMarker is the line after which docs/design.md and the package
// comment of the request path list the kinds of container that serve
// tells apart, in its order, and each kind's steps: one line a kind, its
// function, two or more spaces, the Path methods it calls in order,
// separated by ", " ("-" for none); then one line for the answer every
// kind shares (answerStep) and its steps.
const kindsMarker = "<!-- request path kinds: serve's order; each kind's steps -->"

// answerStep is the step that ends the kinds' paths: the answer they
// share, listed after the kinds with the Path methods it calls.
const answerStep = "answer"

// pipelineDir is the request path's package, from this directory.
var pipelineDir = filepath.Join("..", "internal", "requestpath", "pipeline")

// kind is one line of the list: a kind's function and its steps.
type kind struct {
	Name  string
	Steps []string
}

// TestRequestPathKinds checks docs/design.md's list of the request path's
// kinds and steps, and the same list in the package comment, against the
// code: the kinds are the Path methods that serve returns the answer of,
// in its order ("none" where it returns no answer for a container without
// a request), and a kind's steps are the Path methods its function calls,
// in order; the last line is the shared answer's, with the Path methods
// it calls. Every step has a bullet in design.md's list of steps.
func TestRequestPathKinds(t *testing.T) {
	code, err := codeKinds(pipelineDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(code) < 5 {
		t.Fatalf("read %d kinds from the code (%v): the test no longer follows serve", len(code), code)
	}
	design, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := parseKinds(string(design), "")
	if err != nil {
		t.Fatalf("design.md: %v", err)
	}
	if d := cmp.Diff(code, doc); d != "" {
		t.Errorf("design.md's request path kinds differ from the code (-code +design.md):\n%s", d)
	}
	comment, err := packageComment(pipelineDir)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := parseKinds(comment, "\t")
	if err != nil {
		t.Fatalf("package comment: %v", err)
	}
	if d := cmp.Diff(code, pkg); d != "" {
		t.Errorf("the package comment's request path kinds differ from the code (-code +comment):\n%s", d)
	}
	for _, k := range code {
		for _, s := range k.Steps {
			if k.Name != "privileged" && !strings.Contains(string(design), "\n- **"+s+"**") {
				t.Errorf("design.md has no bullet for step %s (of %s)", s, k.Name)
			}
		}
	}
}

// TestParseKinds checks the list's parser on a small case.
func TestParseKinds(t *testing.T) {
	doc := "x\n" + kindsMarker + "\n```text\na  b, c\nnone   -\n```\nafter\n"
	got, err := parseKinds(doc, "")
	if want := []kind{{"a", []string{"b", "c"}}, {"none", nil}}; err != nil || !cmp.Equal(got, want) {
		t.Errorf("parseKinds = %v, %v; want %v", got, err, want)
	}
	if _, err := parseKinds("no marker", ""); err == nil {
		t.Error("a document without the marker parsed")
	}
	if _, err := parseKinds(kindsMarker+"\n```text\na b\n```\n", ""); err == nil {
		t.Error("a line without two spaces after its kind parsed")
	}
}

// listLine is one line of the list: a Go name, two or more spaces, the
// steps.
var listLine = regexp.MustCompile(`^([A-Za-z]\w*) {2,}(\S.*)$`)

// parseKinds returns the list after kindsMarker: in design.md the lines of
// the fenced block that follows; in a Go doc comment (indent "\t") the
// indented lines that follow, up to the first line that is not.
func parseKinds(doc, indent string) ([]kind, error) {
	_, after, ok := strings.Cut(doc, kindsMarker)
	if !ok {
		return nil, fmt.Errorf("no line %q", kindsMarker)
	}
	var out []kind
	started := false
	for _, l := range strings.Split(after, "\n")[1:] {
		switch {
		case indent == "" && !started:
			if strings.TrimSpace(l) != "```text" {
				return nil, fmt.Errorf("the marker is followed by %q, not a ```text block", l)
			}
			started = true
			continue
		case indent == "" && strings.TrimSpace(l) == "```":
			return out, nil
		case indent != "" && strings.TrimSpace(l) == "" && !started:
			continue
		case indent != "" && !strings.HasPrefix(l, indent):
			return out, nil
		}
		started = true
		m := listLine.FindStringSubmatch(strings.TrimPrefix(l, indent))
		if m == nil {
			return nil, fmt.Errorf("line %q is not a kind, two spaces and its steps", l)
		}
		k := kind{Name: m[1]}
		if m[2] != "-" {
			k.Steps = strings.Split(m[2], ", ")
		}
		out = append(out, k)
	}
	if indent == "" {
		return nil, fmt.Errorf("the block after %q does not end", kindsMarker)
	}
	return out, nil
}

// codeKinds reads the kinds and their steps from the request path's
// source (see TestRequestPathKinds).
func codeKinds(dir string) ([]kind, error) {
	fns, err := pathMethods(dir)
	if err != nil {
		return nil, err
	}
	serve, ok := fns["serve"]
	if !ok {
		return nil, fmt.Errorf("no method serve in %s", dir)
	}
	var out []kind
	ast.Inspect(serve.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CaseClause:
			for _, st := range n.Body {
				if r, ok := st.(*ast.ReturnStmt); ok && len(r.Results) > 0 && isNil(r.Results[0]) {
					out = append(out, kind{Name: "none"})
				}
			}
		case *ast.ReturnStmt:
			if len(n.Results) > 0 {
				if name, ok := pathCall(n.Results[0], serve); ok {
					out = append(out, kind{Name: name})
				}
			}
		}
		return true
	})
	out = append(out, kind{Name: answerStep})
	for i, k := range out {
		if k.Name == "none" {
			continue
		}
		fn, ok := fns[k.Name]
		if !ok {
			return nil, fmt.Errorf("serve returns %s, which is no method of Path", k.Name)
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if name, ok := pathCall(call, fn); ok {
					out[i].Steps = append(out[i].Steps, name)
				}
			}
			return true
		})
	}
	return out, nil
}

// pathMethods parses the package's non-test files and returns its
// methods on *Path by name.
func pathMethods(dir string) (map[string]*ast.FuncDecl, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no Go files in %s: %v", dir, err)
	}
	fns := map[string]*ast.FuncDecl{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		if err != nil {
			return nil, err
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 || len(fd.Recv.List[0].Names) != 1 {
				continue
			}
			if star, ok := fd.Recv.List[0].Type.(*ast.StarExpr); ok {
				if id, ok := star.X.(*ast.Ident); ok && id.Name == "Path" {
					fns[fd.Name.Name] = fd
				}
			}
		}
	}
	return fns, nil
}

// pathCall reports the method name of e when e calls a method on fn's
// receiver (p.step(...)).
func pathCall(e ast.Expr, fn *ast.FuncDecl) (string, bool) {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return "", false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	recv, ok := sel.X.(*ast.Ident)
	return sel.Sel.Name, ok && recv.Name == fn.Recv.List[0].Names[0].Name
}

func isNil(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "nil"
}

// packageComment returns the package comment of the package in dir.
func packageComment(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return "", err
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return "", err
		}
		if af.Doc != nil {
			return af.Doc.Text(), nil
		}
	}
	return "", fmt.Errorf("no package comment in %s", dir)
}
