package main

import (
	"strings"
	"testing"
)

// The output of `go test -json` for a package with a passing, a failing
// (in a subtest), a skipped and an unexplained skipped test, a package
// whose test binary panicked, one without tests, and a line that is not
// JSON.
const input = `{"Action":"start","Package":"p/a"}
{"Action":"run","Package":"p/a","Test":"TestOK"}
{"Action":"output","Package":"p/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"p/a","Test":"TestOK","Output":"    a_test.go:3: noise\n"}
{"Action":"output","Package":"p/a","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"p/a","Test":"TestOK"}
{"Action":"run","Package":"p/a","Test":"TestFail"}
{"Action":"output","Package":"p/a","Test":"TestFail","Output":"=== RUN   TestFail\n"}
{"Action":"run","Package":"p/a","Test":"TestFail/sub"}
{"Action":"output","Package":"p/a","Test":"TestFail/sub","Output":"=== RUN   TestFail/sub\n"}
{"Action":"output","Package":"p/a","Test":"TestFail/sub","Output":"    a_test.go:4: boom\n"}
{"Action":"output","Package":"p/a","Test":"TestFail/sub","Output":"--- FAIL: TestFail/sub (0.00s)\n"}
{"Action":"fail","Package":"p/a","Test":"TestFail/sub"}
{"Action":"output","Package":"p/a","Test":"TestFail","Output":"--- FAIL: TestFail (0.00s)\n"}
{"Action":"fail","Package":"p/a","Test":"TestFail"}
{"Action":"run","Package":"p/a","Test":"TestSkip"}
{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"=== RUN   TestSkip\n"}
{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"    a_test.go:5: needs root: mknod\n"}
{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"--- SKIP: TestSkip (0.00s)\n"}
{"Action":"skip","Package":"p/a","Test":"TestSkip"}
{"Action":"run","Package":"p/a","Test":"TestBare"}
{"Action":"output","Package":"p/a","Test":"TestBare","Output":"    a_test.go:6: \n"}
{"Action":"output","Package":"p/a","Test":"TestBare","Output":"--- SKIP: TestBare (0.00s)\n"}
{"Action":"skip","Package":"p/a","Test":"TestBare"}
{"Action":"output","Package":"p/a","Output":"FAIL\n"}
{"Action":"output","Package":"p/a","Output":"FAIL\tp/a\t0.01s\n"}
{"Action":"fail","Package":"p/a"}
{"Action":"run","Package":"p/b","Test":"TestPanic"}
{"Action":"output","Package":"p/b","Test":"TestPanic","Output":"panic: boom\n"}
{"Action":"output","Package":"p/b","Output":"FAIL\tp/b\t0.01s\n"}
{"Action":"fail","Package":"p/b"}
{"Action":"output","Package":"p/c","Output":"PASS\n"}
{"Action":"output","Package":"p/c","Output":"ok  \tp/c\t0.01s\n"}
{"Action":"pass","Package":"p/c"}
{"Action":"output","Package":"p/d","Output":"?   \tp/d\t[no test files]\n"}
{"Action":"skip","Package":"p/d"}
not json
`

const want = `    a_test.go:4: boom
--- FAIL: TestFail/sub (0.00s)
--- FAIL: TestFail (0.00s)
FAIL
FAIL	p/a	0.01s
panic: boom
FAIL	p/b	0.01s
ok  	p/c	0.01s
?   	p/d	[no test files]
not json
skipped: 2 of 5 tests and subtests:
  p/a TestSkip: a_test.go:5: needs root: mknod
  p/a TestBare: (no reason given) a_test.go:6
`

func TestReport(t *testing.T) {
	var b strings.Builder
	r := newReport(&b)
	r.read(strings.NewReader(input))
	r.summary()
	if b.String() != want {
		t.Errorf("report:\n%s\nwant:\n%s", b.String(), want)
	}
	if !r.failed {
		t.Error("failures not noticed")
	}
}

func TestReportPass(t *testing.T) {
	var b strings.Builder
	r := newReport(&b)
	r.read(strings.NewReader(`{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Output":"ok  \tp\t0.01s\n"}
{"Action":"pass","Package":"p"}
`))
	r.summary()
	if r.failed || b.String() != "ok  \tp\t0.01s\nskipped: none of 1 tests and subtests\n" {
		t.Errorf("failed %v, report:\n%s", r.failed, b.String())
	}
}
