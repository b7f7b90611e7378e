package docs

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// maxTracked is the largest file the repository may track: build outputs
// (binaries, images, archives) are ignored, never committed.
const maxTracked = 1 << 20

// TestNoBuildOutputsTracked fails on any tracked file over 1 MiB and on
// any tracked ELF file outside the fuzz corpora (testdata/fuzz/), which
// hold real ELF headers on purpose. Every clone downloads what git tracks;
// binaries belong in bin/ and .gitignore.
func TestNoBuildOutputsTracked(t *testing.T) {
	if _, err := os.Stat("../.git"); err != nil {
		t.Skip("not a git checkout (a source archive): nothing tracked to check")
	}
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	if len(files) < 100 {
		t.Fatalf("git ls-files lists %d files: is the test running in docs/?", len(files))
	}
	for _, f := range files {
		if problem := trackedProblem(f, "../"+f); problem != "" {
			t.Error(problem)
		}
	}
}

// trackedProblem says what is wrong with tracking file name (read from
// path), or "" when nothing is.
func trackedProblem(name, path string) string {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return "" // a symlink, or deleted in the work tree
	}
	if fi.Size() > maxTracked {
		return name + ": " + fi.Name() + " is tracked and over 1 MiB: a build output? (ignore it in .gitignore)"
	}
	if strings.Contains("/"+name, "/testdata/fuzz/") {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return name + ": " + err.Error()
	}
	defer f.Close()
	head := make([]byte, 4)
	if n, _ := f.Read(head); n == 4 && bytes.Equal(head, []byte("\x7fELF")) {
		return name + ": a tracked ELF file outside testdata/fuzz/: a build output? (ignore it in .gitignore)"
	}
	return ""
}

// TestTrackedProblem checks the checker on an ELF file, a large file and a
// fuzz corpus entry.
func TestTrackedProblem(t *testing.T) {
	dir := t.TempDir()
	elf := dir + "/prog"
	if err := os.WriteFile(elf, []byte("\x7fELF\x02\x01\x01"), 0o755); err != nil {
		t.Fatal(err)
	}
	big := dir + "/big.txt"
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), maxTracked+1), 0o644); err != nil {
		t.Fatal(err)
	}
	small := dir + "/small.txt"
	if err := os.WriteFile(small, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, want string }{
		{"nri-gpu", elf, "ELF"},
		{"a/testdata/fuzz/FuzzParseELF/x", elf, ""},
		{"test/e2e/demo", big, "over 1 MiB"},
		{"a/testdata/fuzz/big", big, "over 1 MiB"},
		{"README.md", small, ""},
	} {
		got := trackedProblem(tc.name, tc.path)
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("trackedProblem(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
