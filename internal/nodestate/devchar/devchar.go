// Package devchar keeps the host's /dev/char/<major>:<minor> links for the
// device nodes nri-gpu injects. With the systemd cgroup driver, runc hands
// systemd a container's device rules as DeviceAllow=/dev/char/<major>:<minor>
// entries; NVIDIA's driver makes its nodes without the udev events that
// create those links, and where runc finds no link (systemd before v240)
// it leaves the entry out: the next `systemctl daemon-reload` rewrites the
// container's device cgroup without its GPUs ("Failed to initialize NVML:
// Unknown Error"). Ensure makes each missing link, relative (../nvidia0),
// and records what it made in its state directory. The links outlive
// nri-gpu: Ensure removes one of its own only when the device node is gone
// from the host, and nothing removes them when nri-gpu stops; Remove (the
// `nri-gpu cleanup` command) takes away the links the record lists that
// are still as made. An existing link or file is never replaced. Every
// path is resolved inside the host root.
package devchar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Dir is the directory of the links, under the host root.
const Dir = "/dev/char"

// RecordName is the file, in the state directory, that lists the links
// nri-gpu made.
const RecordName = "devchar-links.json"

// tempPrefix starts the names of the record's temporary files.
const tempPrefix = ".devchar-"

// IsRecordFile reports whether name, an entry of the state directory, is
// the record or one of its temporary files: what the library cache, which
// may share the directory (/var/lib/nri-gpu in the DaemonSet), leaves
// alone.
func IsRecordFile(name string) bool { return name == RecordName || strings.HasPrefix(name, tempPrefix) }

// bootIDPath is the kernel's id of the running boot, under the host root:
// a record of another boot lists links that vanished with its /dev.
const bootIDPath = "proc/sys/kernel/random/boot_id"

// Options say where the links and the record are.
type Options struct {
	// HostRoot is where the host's /dev (and /proc) are read and written
	// ("/" on the host, "/host" in the DaemonSet).
	HostRoot string
	// StateDir is the directory of the record, as this process sees it.
	StateDir string
}

// Link is one /dev/char link: its name (<major>:<minor>) and target
// (relative to /dev/char, as udev makes them: ../nvidia0).
type Link struct {
	Name   string `json:"name"`
	Target string `json:"target"`
}

// matches reports whether a link's target names the node as l does:
// l's relative target, or the node's absolute path.
func (l Link) matches(target string) bool {
	return target == l.Target || target == "/dev/"+strings.TrimPrefix(l.Target, "../")
}

// Path returns the link's path on the host (/dev/char/<name>).
func (l Link) Path() string { return Dir + "/" + l.Name }

// record is the state file.
type record struct {
	BootID string `json:"bootID"`
	Links  []Link `json:"links"`
}

// Result says what Ensure found and did.
type Result struct {
	// Created are the links made now.
	Created []Link
	// Present counts the nodes whose link was there already, pointing at
	// the node (made by udev, by an earlier run, by the operator).
	Present int
	// Foreign are links or files at a node's name that do not point at
	// the node: left alone, reported.
	Foreign []string
	// Removed are links nri-gpu made earlier whose device node is gone
	// from the host (a GPU gone, a driver reload that moved a major):
	// removed now.
	Removed []Link
}

// LinkFor returns the link of node n: /dev/char/<major>:<minor> ->
// ../<path below /dev>; false for a node outside /dev.
func LinkFor(n inventory.DeviceNode) (Link, bool) {
	rel, ok := strings.CutPrefix(path.Clean(n.Path), "/dev/")
	if !ok || rel == "" {
		return Link{}, false
	}
	return Link{Name: fmt.Sprintf("%d:%d", n.Major, n.Minor), Target: "../" + rel}, true
}

// Nodes returns the device nodes of s that nri-gpu injects: every GPU, the
// GPUs' DRM nodes (graphics and display), the control nodes, the IMEX
// channels, then the MIG capability nodes (each MIG device's GPU and
// compute instance access, mig config and monitor) that the host has,
// duplicates dropped, in that order.
func Nodes(s *inventory.Snapshot) []inventory.DeviceNode {
	var out []inventory.DeviceNode
	add := func(n inventory.DeviceNode) {
		if !slices.ContainsFunc(out, func(o inventory.DeviceNode) bool { return o.Major == n.Major && o.Minor == n.Minor }) {
			out = append(out, n)
		}
	}
	for _, g := range s.GPUs {
		add(g.Node)
	}
	for _, g := range s.GPUs {
		for _, n := range [...]inventory.DeviceNode{g.Card(), g.Render()} {
			if n.Path != "" {
				add(n)
			}
		}
	}
	c := s.Control
	for _, n := range [...]*inventory.DeviceNode{c.Ctl, c.UVM, c.UVMTools, c.Modeset} {
		if n != nil {
			add(*n)
		}
	}
	for _, ch := range s.IMEXChannels {
		add(ch.Node)
	}
	// MIG capability nodes: a container's device rules name them like
	// the GPU's, but the driver makes them only once something (nvidia-smi,
	// nvidia-modprobe, the toolkit) asked for them; a link to a node that
	// is not there would not help runc (it stats the link), so only those
	// the host has are linked.
	var migNodes []inventory.DeviceNode
	for _, m := range s.MIG {
		migNodes = append(migNodes, m.GINode, m.CINode)
	}
	for _, n := range [...]*inventory.DeviceNode{s.MIGControl.Config, s.MIGControl.Monitor} {
		if n != nil {
			migNodes = append(migNodes, *n)
		}
	}
	for _, n := range migNodes {
		if hostHasNode(s.HostRoot, n) {
			add(n)
		}
	}
	return out
}

// hostHasNode reports whether hostRoot has a character device at n's
// path with n's numbers.
func hostHasNode(hostRoot string, n inventory.DeviceNode) bool {
	if hostRoot == "" {
		hostRoot = "/"
	}
	fi, err := os.Lstat(filepath.Join(hostRoot, filepath.FromSlash(path.Clean("/"+n.Path))))
	if err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	return int64(unix.Major(uint64(st.Rdev))) == n.Major && int64(unix.Minor(uint64(st.Rdev))) == n.Minor
}

// Ensure makes the missing /dev/char links of nodes and adds them to the
// record. A name that exists (a link, whatever its target, or a file) is
// left as it is. A recorded link is removed only when its device node is
// gone from the host, whether nodes lists it or not. Links of the record
// that are gone are dropped from it; a record of an earlier boot is
// dropped whole. It stops at the first error of the file system, with the
// record written for what it made.
func Ensure(o Options, nodes []inventory.DeviceNode) (Result, error) {
	var res Result
	root, err := os.OpenRoot(o.HostRoot)
	if err != nil {
		return res, fmt.Errorf("opening hostRoot: %w", err)
	}
	defer root.Close()
	rec, err := load(o, root)
	if err != nil {
		return res, err
	}
	dir := strings.TrimPrefix(Dir, "/")
	if _, err := root.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := root.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return res, fmt.Errorf("creating %s: %w", Dir, err)
		}
	}
	var ferr error
	for _, n := range nodes {
		l, ok := LinkFor(n)
		if !ok {
			continue
		}
		name := dir + "/" + l.Name
		switch target, err := root.Readlink(name); {
		case err == nil && l.matches(target):
			res.Present++
			continue
		case err == nil:
			res.Foreign = append(res.Foreign, fmt.Sprintf("%s -> %s (not %s)", l.Path(), target, l.Target))
			continue
		case !errors.Is(err, fs.ErrNotExist):
			if _, serr := root.Lstat(name); serr == nil {
				res.Foreign = append(res.Foreign, l.Path()+" is not a link")
				continue
			}
		}
		if err := root.Symlink(l.Target, name); err != nil {
			if errors.Is(err, fs.ErrExist) {
				res.Foreign = append(res.Foreign, l.Path()+" appeared meanwhile")
				continue
			}
			ferr = fmt.Errorf("creating %s -> %s: %w", l.Path(), l.Target, err)
			break
		}
		res.Created = append(res.Created, l)
		if !slices.Contains(rec.Links, l) {
			rec.Links = append(rec.Links, l)
		}
	}
	if ferr == nil {
		ferr = dropStale(root, &rec, &res)
	}
	if err := save(o, rec); err != nil && ferr == nil {
		ferr = err
	}
	return res, ferr
}

// dropStale removes the recorded links whose device node is gone from
// the host (a GPU removed, a driver reload that moved a major, a MIG
// instance destroyed), from the host and from the record. A node that is
// still there keeps its link whatever the snapshot says: a container
// that was given it still has it, and a discovery can see less than the
// host has (an NVML that does not answer for a while).
func dropStale(root *os.Root, rec *record, res *Result) error {
	kept := rec.Links[:0]
	var err error
	for _, l := range rec.Links {
		if err != nil || nodeOnHost(root, l) {
			kept = append(kept, l)
			continue
		}
		if rerr := root.Remove(strings.TrimPrefix(l.Path(), "/")); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = fmt.Errorf("removing %s: %w", l.Path(), rerr)
			kept = append(kept, l)
			continue
		}
		res.Removed = append(res.Removed, l)
	}
	rec.Links = kept
	return err
}

// nodeOnHost reports whether l's target, under the host's /dev, is a
// character device with the numbers of l's name.
func nodeOnHost(root *os.Root, l Link) bool {
	var major, minor int64
	if _, err := fmt.Sscanf(l.Name, "%d:%d", &major, &minor); err != nil {
		return false
	}
	rel, ok := strings.CutPrefix(l.Target, "../")
	if !ok || rel == "" {
		return false
	}
	fi, err := root.Lstat(path.Join("dev", rel))
	if err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int64(unix.Major(uint64(st.Rdev))) == major && int64(unix.Minor(uint64(st.Rdev))) == minor
}

// Remove removes the links the record lists that are still links with the
// recorded target, then the record; it returns the links it removed. A
// link that was replaced (by udev, by the operator) is left alone.
func Remove(o Options) ([]Link, error) {
	root, err := os.OpenRoot(o.HostRoot)
	if err != nil {
		return nil, fmt.Errorf("opening hostRoot: %w", err)
	}
	defer root.Close()
	rec, err := load(o, root)
	if err != nil {
		return nil, err
	}
	var removed []Link
	for _, l := range rec.Links {
		name := strings.TrimPrefix(l.Path(), "/")
		if target, err := root.Readlink(name); err != nil || target != l.Target {
			continue
		}
		if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("removing %s: %w", l.Path(), err)
		}
		removed = append(removed, l)
	}
	if err := os.Remove(filepath.Join(o.StateDir, RecordName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return removed, err
	}
	return removed, nil
}

// Recorded returns the links the record lists as made in this boot and
// still present as made: what Remove would remove.
func Recorded(o Options) ([]Link, error) {
	root, err := os.OpenRoot(o.HostRoot)
	if err != nil {
		return nil, fmt.Errorf("opening hostRoot: %w", err)
	}
	defer root.Close()
	rec, err := load(o, root)
	return rec.Links, err
}

// maxRecord bounds the record file: a node's links are a few hundred
// (2048 IMEX channels at most, by default).
const maxRecord = 1 << 20

// load reads the record: empty when there is none, when it is of another
// boot, and without the links that are no longer there as made.
func load(o Options, root *os.Root) (record, error) {
	boot := bootID(root)
	rec := record{BootID: boot}
	data, err := os.ReadFile(filepath.Join(o.StateDir, RecordName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return rec, nil
	case err != nil:
		return rec, fmt.Errorf("reading the record of /dev/char links: %w", err)
	case len(data) > maxRecord:
		return rec, fmt.Errorf("%s: larger than %d bytes", filepath.Join(o.StateDir, RecordName), maxRecord)
	}
	var old record
	if err := json.Unmarshal(data, &old); err != nil {
		return rec, fmt.Errorf("%s: %w", filepath.Join(o.StateDir, RecordName), err)
	}
	if old.BootID != boot {
		return rec, nil
	}
	for _, l := range old.Links {
		if strings.ContainsAny(l.Name, "/\x00") || l.Name == "" || l.Name == "." || l.Name == ".." {
			continue
		}
		if target, err := root.Readlink(strings.TrimPrefix(l.Path(), "/")); err == nil && target == l.Target {
			rec.Links = append(rec.Links, l)
		}
	}
	return rec, nil
}

// save writes the record (atomically), or removes it when it lists no
// link.
func save(o Options, rec record) error {
	p := filepath.Join(o.StateDir, RecordName)
	if len(rec.Links) == 0 {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.StateDir, 0o755); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	tmp, err := os.CreateTemp(o.StateDir, tempPrefix)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// bootID returns the host's boot id, or "" where it cannot be read.
func bootID(root *os.Root) string {
	f, err := root.Open(bootIDPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	buf := make([]byte, 64)
	n, _ := f.Read(buf)
	return string(bytes.TrimSpace(buf[:n]))
}

// Problem is a node whose link is missing or wrong.
type Problem struct {
	Node inventory.DeviceNode
	Link Link
	// What is wrong: "missing", or what is there instead.
	What string
}

// Check reports, for each node, a missing link or one that does not point
// at the node; it changes nothing.
func Check(hostRoot string, nodes []inventory.DeviceNode) ([]Problem, error) {
	root, err := os.OpenRoot(hostRoot)
	if err != nil {
		return nil, fmt.Errorf("opening hostRoot: %w", err)
	}
	defer root.Close()
	var out []Problem
	for _, n := range nodes {
		l, ok := LinkFor(n)
		if !ok {
			continue
		}
		target, err := root.Readlink(strings.TrimPrefix(l.Path(), "/"))
		switch {
		case err == nil && l.matches(target):
		case err == nil:
			out = append(out, Problem{Node: n, Link: l, What: "points at " + target})
		case errors.Is(err, fs.ErrNotExist):
			out = append(out, Problem{Node: n, Link: l, What: "missing"})
		default:
			out = append(out, Problem{Node: n, Link: l, What: "not a link"})
		}
	}
	return out, nil
}
