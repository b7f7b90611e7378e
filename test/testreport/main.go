// Command testreport runs `go test -json ...` and prints what plain
// `go test` prints (the ok/FAIL line of each package, and the output of
// failing tests only), then how many tests were skipped, each with its
// reason: a skipped test is not a passed one, and a user without root
// skips more. It exits with the command's status, and non-zero also if a
// test or package failed.
//
//	testreport go test -json -race -count=1 ./...
//
// Lines that are not JSON (the command's other output) are passed through.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testreport go test -json [flags] [packages]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	r := newReport(os.Stdout)
	r.read(out)
	err = cmd.Wait()
	r.summary()
	code := 0
	if err != nil {
		code = 1
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() > 0 {
			code = ee.ExitCode()
		}
		if !r.failed {
			fmt.Fprintf(os.Stderr, "testreport: %s: %v\n", strings.Join(os.Args[1:], " "), err)
		}
	} else if r.failed {
		code = 1
	}
	os.Exit(code)
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output, build-fail
}

type key struct{ pkg, test string }

type report struct {
	w       io.Writer
	pending map[key][]string // output of tests still running
	skipped []string         // "pkg Test: reason"
	tests   int              // tests that ended: passed, failed or skipped
	failed  bool
}

func newReport(w io.Writer) *report {
	return &report{w: w, pending: map[key][]string{}}
}

// read handles the command's output to its end.
func (r *report) read(in io.Reader) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(r.w, "%s\n", line)
			continue
		}
		r.handle(e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(r.w, "testreport: reading the output:", err)
		r.failed = true
	}
}

// print writes go test's text; a report that cannot be written is a
// failed run.
func (r *report) print(s string) {
	if _, err := io.WriteString(r.w, s); err != nil {
		r.failed = true
	}
}

func (r *report) handle(e event) {
	switch {
	case e.Action == "build-output":
		r.print(e.Output)
	case e.Action == "build-fail":
		r.failed = true
	case e.Test == "":
		r.pkg(e)
	default:
		r.test(e)
	}
}

// pkg handles a package's own events: its output (the ok/FAIL lines) is
// printed as plain go test prints it.
func (r *report) pkg(e event) {
	switch e.Action {
	case "output":
		if strings.HasPrefix(e.Output, "FAIL") {
			r.flush(e.Package)
		}
		if e.Output != "PASS\n" { // plain go test leaves out the PASS of a passing package
			r.print(e.Output)
		}
	case "fail":
		r.failed = true
		r.flush(e.Package)
	case "pass", "skip":
		for k := range r.pending {
			if k.pkg == e.Package {
				delete(r.pending, k)
			}
		}
	}
}

// flush prints what the tests of pkg that never ended (cut short by a
// panic or a timeout) printed.
func (r *report) flush(pkg string) {
	var tests []string
	for k := range r.pending {
		if k.pkg == pkg {
			tests = append(tests, k.test)
		}
	}
	slices.Sort(tests)
	for _, t := range tests {
		k := key{pkg, t}
		r.print(strings.Join(r.pending[k], ""))
		delete(r.pending, k)
	}
}

// test handles a test's events: its output is kept until it ends, and
// printed only if it failed.
func (r *report) test(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "output":
		r.pending[k] = append(r.pending[k], e.Output)
	case "fail":
		r.tests++
		r.failed = true
		for _, l := range r.pending[k] {
			if !framing(l) {
				r.print(l)
			}
		}
		delete(r.pending, k)
	case "skip":
		r.tests++
		r.skipped = append(r.skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(r.pending[k])))
		delete(r.pending, k)
	case "pass":
		r.tests++
		delete(r.pending, k)
	}
}

// framing reports whether l is one of the lines go test -v adds around a
// test's own output, which plain go test does not print.
func framing(l string) bool {
	t := strings.TrimSpace(l)
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME"} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// reason is what a skipped test printed: its t.Skip message (and any log
// before it), on one line.
func reason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || framing(l) || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		parts = append(parts, t)
	}
	r := strings.Join(parts, " ")
	// t.Skip() without a message prints only its place: "x_test.go:12:".
	if len(parts) == 0 || (len(parts) == 1 && strings.HasSuffix(r, ":") && !strings.Contains(r, " ")) {
		return strings.TrimSpace("(no reason given) " + strings.TrimSuffix(r, ":"))
	}
	return r
}

// summary prints how many tests were skipped, and which, with why.
func (r *report) summary() {
	if len(r.skipped) == 0 {
		fmt.Fprintf(r.w, "skipped: none of %d tests and subtests\n", r.tests)
		return
	}
	fmt.Fprintf(r.w, "skipped: %d of %d tests and subtests:\n", len(r.skipped), r.tests)
	for _, s := range r.skipped {
		fmt.Fprintf(r.w, "  %s\n", s)
	}
}
