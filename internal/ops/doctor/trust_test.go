package doctor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// impostorEnv, when set, makes the test binary an impostor: it serves a
// status API that says "ready" on the unix socket the variable names,
// prints "listening" and serves until killed. TestImpostors runs it as
// another user.
const impostorEnv = "NRI_GPU_DOCTOR_IMPOSTOR_SOCKET"

func TestMain(m *testing.M) {
	if p := os.Getenv(impostorEnv); p != "" {
		l, err := net.Listen("unix", p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println("listening")
		_ = http.Serve(l, status.Handler(readyReporter{}))
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// readyReporter says what an impostor says: ready.
type readyReporter struct{}

func (readyReporter) Status() status.Status { return status.Status{Ready: true} }

// otherUID is a user that is not root and not the test's: 1001 (the dev
// user of the development machine) unless the test runs as 1001; no
// account is needed to own a file or run as it.
var otherUID = func() int {
	if os.Geteuid() == 1001 {
		return 1002
	}
	return 1001
}()

func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root: %s", why)
	}
}

// serveReady serves a status socket that says ready at the fixture's
// default path, as nri-gpu does.
func serveReady(t *testing.T, f *fixture) string {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p := f.n.HostPath(status.DefaultSocket)
	if err := status.Serve(ctx, p, readyReporter{}, log); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestImpostors checks that the doctor believes only nri-gpu's own
// answers: a status socket owned by root (or the doctor's user) and served
// by a process of root (SO_PEERCRED), or a process named nri-gpu run by
// root. Each impostor here says "ready"; the code before this test passed
// every one of them ("reports itself connected and synchronized").
func TestImpostors(t *testing.T) {
	t.Run("trusted status socket", func(t *testing.T) {
		f := newFixture(t, simnode.Options{})
		f.o.HealthURL = ""
		serveReady(t, f)
		expect(t, Run(f.o), "registration", Pass, "reports itself connected and synchronized (status socket")
	})

	t.Run("process named nri-gpu run by another user", func(t *testing.T) {
		f := newFixture(t, simnode.Options{})
		f.o.HealthURL = ""
		f.write(t, "/proc/4242/comm", "nri-gpu\n")
		f.write(t, "/proc/4242/status", fmt.Sprintf("Name:\tnri-gpu\nUid:\t%d\t%d\t%d\t%d\n", otherUID, otherUID, otherUID, otherUID))
		f.write(t, "/proc/4242/cmdline", "nri-gpu\x00run\x00--metrics-addr\x00"+strings.TrimPrefix(f.health.URL, "http://")+"\x00")
		expect(t, Run(f.o), "registration", Fail, fmt.Sprintf("pid 4242, named nri-gpu but run by uid %d", otherUID))
		// A setuid-like mix counts as the untrusted user too.
		f.write(t, "/proc/4242/status", fmt.Sprintf("Name:\tnri-gpu\nUid:\t%d\t0\t0\t0\n", otherUID))
		expect(t, Run(f.o), "registration", Fail, fmt.Sprintf("run by uid %d", otherUID))
	})

	t.Run("status socket owned by another user", func(t *testing.T) {
		needRoot(t, "chowns the socket to another user")
		f := newFixture(t, simnode.Options{})
		f.o.HealthURL = ""
		p := serveReady(t, f)
		if err := os.Lchown(p, otherUID, otherUID); err != nil {
			t.Fatal(err)
		}
		expect(t, Run(f.o), "registration", Fail, fmt.Sprintf("is owned by uid %d, not root", otherUID))
	})

	t.Run("status socket served by another user", func(t *testing.T) {
		needRoot(t, "runs the impostor as another user")
		f := newFixture(t, simnode.Options{})
		f.o.HealthURL = ""
		// The impostor (this test binary, copied where the other user
		// can run it) binds the socket in a directory it may write;
		// the socket is then chowned to root, so that only its peer's
		// credentials tell it from nri-gpu's.
		p := f.n.HostPath(status.DefaultSocket)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		for d := filepath.Dir(p); ; d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if d == filepath.Dir(f.n.Root) {
				break
			}
		}
		if err := os.Chown(filepath.Dir(p), otherUID, otherUID); err != nil {
			t.Fatal(err)
		}
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(filepath.Dir(f.n.Root), "impostor")
		data, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), impostorEnv+"="+p)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(otherUID), Gid: uint32(otherUID)}}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "listening\n" {
			t.Fatalf("impostor: %q, %v", line, err)
		}
		if err := os.Lchown(p, 0, 0); err != nil {
			t.Fatal(err)
		}
		expect(t, Run(f.o), "registration", Fail, fmt.Sprintf("is served by pid %d of uid %d, not root", cmd.Process.Pid, otherUID))
	})
}
