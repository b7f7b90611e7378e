package dra

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// booker records what the driver tells Options.Book, and refuses one
// claim.
type booker struct {
	mu     sync.Mutex
	calls  []string // "<claim being prepared>:<devices>"
	refuse string
}

func (b *booker) book(p *claims.Prepared, claim string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var names []string
	for _, d := range p.Devices() {
		names = append(names, d.Claim.UID+"/"+d.Name)
	}
	b.calls = append(b.calls, claim+":"+strings.Join(names, ","))
	if claim != "" && claim == b.refuse {
		return errors.New("GPU 2 cannot be held exclusively: it is held by ns/local/main (exclusive)")
	}
	return nil
}

// TestBook: the driver tells the NRI side's allocation table (Book) of
// every set of prepared claims before it becomes current: at start, with
// the claim being prepared (a refusal fails that claim, and nothing is
// written: no checkpoint entry, no spec), and after an Unprepare.
func TestBook(t *testing.T) {
	root := t.TempDir()
	b := &booker{refuse: "uid-refused"}
	opts := Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"),
		RegistrationDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev", Book: b.book}
	e := newEnv(t, draConfig(), testSnapshot(), &opts)
	c := e.claim(t, "train", "uid-1", false, "gpu-0")
	if r := e.prepare(t, c); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	refused := e.claim(t, "late", "uid-refused", false, "gpu-2")
	r := e.prepare(t, refused)
	if !strings.Contains(r.GetError(), "prepare claim ml/late: GPU 2 cannot be held exclusively: it is held by ns/local/main") {
		t.Errorf("refused by the table: %v", r)
	}
	if e.spec(t, "uid-refused") != nil || e.d.Prepared().Len() != 1 {
		t.Errorf("a refused claim was written: spec %v, %d devices prepared", e.spec(t, "uid-refused"), e.d.Prepared().Len())
	}
	data, err := os.ReadFile(filepath.Join(opts.PluginDir, "checkpoint.json"))
	if err != nil || strings.Contains(string(data), "uid-refused") {
		t.Errorf("checkpoint %s: %v", data, err)
	}
	e.unprepare(t, c)
	e.stop()
	want := []string{":", "uid-1:uid-1/gpu-0", "uid-refused:uid-1/gpu-0,uid-refused/gpu-2", ":"}
	b.mu.Lock()
	got := b.calls
	b.mu.Unlock()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("Book told %q\nwant %q", got, want)
	}
	// A restart: told of the checkpoint's claims at start.
	b2 := &booker{}
	opts.Book = b2.book
	e2 := newEnv(t, draConfig(), testSnapshot(), &opts)
	c2 := e2.claim(t, "again", "uid-2", false, "gpu-2")
	if r := e2.prepare(t, c2); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	e2.stop()
	// What nri-gpu books before the runtime's Synchronize, without the
	// plugin running.
	prep, err := ReadPrepared(opts.PluginDir)
	if err != nil || prep.Len() != 1 || prep.Devices()[0].Claim.UID != "uid-2" {
		t.Errorf("ReadPrepared: %v, %+v", err, prep.Devices())
	}
	if prep, err := ReadPrepared(filepath.Join(root, "none")); err != nil || prep.Len() != 0 {
		t.Errorf("ReadPrepared without a checkpoint: %v, %d devices", err, prep.Len())
	}
	e3 := newEnv(t, draConfig(), testSnapshot(), &opts)
	defer e3.stop()
	b2.mu.Lock()
	defer b2.mu.Unlock()
	if n := len(b2.calls); n != 3 || b2.calls[2] != ":uid-2/gpu-2" {
		t.Errorf("Book told %q, want the checkpoint's claim at the restart", b2.calls)
	}
}
