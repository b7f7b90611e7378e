package harness

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Process is a process found in /proc.
type Process struct {
	PID     int
	PPID    int
	State   string // R, S, Z, ...
	Cmdline []string
}

// ProcessesUnder lists live (non-zombie) processes whose command line mentions dir
// (an argument equal to dir or containing dir + "/"): containerd (--config
// dir/config.toml), its shims (-address dir/c.sock) and plugins it launched from
// dir. The calling process is never listed.
func ProcessesUnder(dir string) []Process {
	dir = filepath.Clean(dir)
	var out []Process
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		p, ok := readProcess(pid)
		if !ok || p.State == "Z" || p.State == "X" {
			continue
		}
		for _, a := range p.Cmdline {
			if a == dir || strings.Contains(a, dir+"/") {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

func readProcess(pid int) (Process, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return Process{}, false
	}
	p := Process{PID: pid, Cmdline: strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Process{}, false
	}
	// pid (comm) state ppid ...; comm may contain spaces and parens.
	s := string(st)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		f := strings.Fields(s[i+1:])
		if len(f) >= 2 {
			p.State = f[0]
			p.PPID, _ = strconv.Atoi(f[1])
		}
	}
	return p, true
}

// processGone reports whether pid no longer runs (gone or a zombie).
func processGone(pid int) bool {
	p, ok := readProcess(pid)
	return !ok || p.State == "Z" || p.State == "X"
}

// MountsUnder lists mount points at or below dir from /proc/thread-self/mountinfo, deepest
// first.
func MountsUnder(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	// The calling thread's view, not the process leader's: a test that
	// locks a goroutine to its thread to enter a mount namespace of its
	// own and ends it there leaves the Go runtime's main thread, the
	// leader, wedged in that namespace when it ran on it, and
	// /proc/self/mountinfo then shows that namespace's mounts, not the
	// ones this thread unmounts.
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Count(out[i], "/") > strings.Count(out[j], "/")
	})
	return out, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space, ...) of mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// UnmountAll unmounts everything mounted at or below dir, deepest first, lazily
// (MNT_DETACH) where a plain unmount fails.
func UnmountAll(dir string) error {
	var last []string
	for round := 0; round < 10; round++ {
		mounts, err := MountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mounts) == 0 {
			return nil
		}
		last = mounts
		for _, m := range mounts {
			if err := unix.Unmount(m, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				_ = unix.Unmount(m, unix.MNT_DETACH)
			}
		}
	}
	return fmt.Errorf("still mounted under %s: %v", dir, last)
}

// runcState is the part of runc's state.json the cleanup needs.
type runcState struct {
	InitProcessPid int               `json:"init_process_pid"`
	CgroupPaths    map[string]string `json:"cgroup_paths"`
}

// CleanupDir tears down whatever a harness containerd left under dir, without
// asking containerd: kills containerd, deletes every runc container under dir/runc
// (killing its processes and removing its cgroups), kills by PID the shims and the
// plugins containerd launched from dir (see ownedProcesses), unmounts everything
// under dir and removes dir. runc may be empty; then containers are killed by their
// init PID.
func CleanupDir(dir, runc string) error {
	dir = filepath.Clean(dir)
	var errs []error

	// 1. containerd (or CRI-O) itself first, so that nothing restarts or reacts.
	for _, pidFile := range []string{"containerd.pid", "crio.pid"} {
		if b, err := os.ReadFile(filepath.Join(dir, pidFile)); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				if p, ok := readProcess(pid); ok && len(p.Cmdline) > 0 && strings.Contains(strings.Join(p.Cmdline, " "), dir+"/") {
					killAndWait([]int{pid}, 5*time.Second)
				}
			}
		}
	}

	// 2. Containers: runc delete --force kills all of a container's processes and
	// removes its cgroups.
	states, _ := filepath.Glob(filepath.Join(dir, "runc", "*", "*", "state.json"))
	for _, sf := range states {
		root := filepath.Dir(filepath.Dir(sf))
		id := filepath.Base(filepath.Dir(sf))
		var st runcState
		if b, err := os.ReadFile(sf); err == nil {
			_ = json.Unmarshal(b, &st)
		}
		deleted := false
		if runc != "" {
			if out, err := exec.Command(runc, "--root", root, "delete", "--force", id).CombinedOutput(); err == nil {
				deleted = true
			} else if !strings.Contains(string(out), "does not exist") {
				errs = append(errs, fmt.Errorf("runc delete --force %s: %v: %s", id, err, strings.TrimSpace(string(out))))
			}
		}
		if !deleted && st.InitProcessPid > 0 && !processGone(st.InitProcessPid) {
			killAndWait([]int{st.InitProcessPid}, 5*time.Second)
		}
		if !deleted {
			for _, cg := range st.CgroupPaths {
				_ = os.Remove(cg) // rmdir of an empty cgroup
			}
		}
	}

	// 3. Shims (and whatever else containerd started for this dir), by PID.
	var pids []int
	for _, p := range ownedProcesses(dir, runc) {
		pids = append(pids, p.PID)
	}
	killAndWait(pids, 10*time.Second)
	if left := ownedProcesses(dir, runc); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes still running for %s: %v", dir, left))
	}

	// 4. Mounts (container rootfs binds, sandbox /dev/shm, ...), deepest first.
	if err := UnmountAll(dir); err != nil {
		errs = append(errs, err)
	}

	// 5. The dir itself.
	if len(errs) == 0 {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ownedProcesses are the processes of ProcessesUnder(dir) that the harness's
// containerd started: containerd and its shims (containerd*), CRI-O and its
// container monitors (crio, conmon), runc, a cluster's control plane and
// kubelets, and
// executables under dir (NRI plugins pre-registered in dir/nri/plugins).
// Processes a test started itself, such as a plugin given --socket dir/nri.sock,
// are left to the test.
func ownedProcesses(dir, runc string) []Process {
	var out []Process
	for _, p := range ProcessesUnder(dir) {
		if len(p.Cmdline) == 0 {
			continue
		}
		arg0 := p.Cmdline[0]
		base := filepath.Base(arg0)
		if strings.HasPrefix(arg0, dir+"/") || strings.HasPrefix(base, "containerd") || base == "crio" || base == "conmon" || base == "runc" || (runc != "" && arg0 == runc) ||
			clusterCommands[base] {
			out = append(out, p)
		}
	}
	return out
}

// clusterCommands are the cluster's processes (Cluster, its nodes'
// kubelets), found by a directory of theirs in their arguments.
var clusterCommands = map[string]bool{"etcd": true, "kube-apiserver": true, "kube-controller-manager": true, "kube-scheduler": true, "kubelet": true}

// killAndWait sends SIGKILL to pids and waits until they are gone.
func killAndWait(pids []int, timeout time.Duration) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for !processGone(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// ReapStale cleans up harness dirs (os.TempDir()/nrie2e-*) whose owning test
// process is gone, e.g. after a test binary was killed. It returns the dirs it
// cleaned.
func ReapStale(runc string) ([]string, error) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "nrie2e-*"))
	var cleaned []string
	var errs []error
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() || !processGone(pid) {
			continue
		}
		if err := CleanupDir(d, runc); err != nil {
			errs = append(errs, err)
			continue
		}
		cleaned = append(cleaned, d)
	}
	return cleaned, errors.Join(errs...)
}
