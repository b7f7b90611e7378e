package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function of the product may be, from its
// func line to its closing brace, unless its doc comment says why it is
// "one piece" (CONTRIBUTING.md, the house style).
const maxFuncLines = 80

// TestFunctionLength fails on a function of the product's packages (not
// tests, not test/) longer than maxFuncLines whose doc comment does not
// say why it is one piece.
func TestFunctionLength(t *testing.T) {
	checked := 0
	for _, dir := range []string{"adjust", "cmd", "internal", "inventory", "plugin"} {
		err := filepath.WalkDir(filepath.Join("..", dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				checked++
				n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
				if n > maxFuncLines && !onePiece(fd.Doc) {
					t.Errorf("%s: %s is %d lines (at most %d unless its doc comment says why it is one piece)", fset.Position(fd.Pos()), fd.Name.Name, n, maxFuncLines)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 500 {
		t.Errorf("checked %d functions: the test no longer finds the product's packages", checked)
	}
}

// onePiece reports whether a doc comment says why its function is one
// piece.
func onePiece(doc *ast.CommentGroup) bool {
	return doc != nil && strings.Contains(strings.ToLower(strings.Join(strings.Fields(doc.Text()), " ")), "one piece")
}
