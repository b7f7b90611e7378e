package simnode

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// elfJob is one ELF file to build with gcc: source compiled with args.
type elfJob struct {
	name   string   // file name in the tree, also used in the cache file name
	source string   // C source
	args   []string // gcc arguments besides the source and -o
}

// cflags are the gcc flags every object is built with.
var cflags = []string{"-O2", "-Wall", "-g0"}

// cacheDir returns the directory for cached ELF files, creating it.
func cacheDir(dir string) (string, error) {
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = filepath.Join(os.TempDir(), "nri-gpu-simnode-"+strconv.Itoa(os.Getuid()))
			dir = base
		} else {
			dir = filepath.Join(base, "nri-gpu-simnode")
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("simnode: cache directory: %w", err)
	}
	return dir, nil
}

// cacheKey identifies the output of a job built by the compiler gccID.
func cacheKey(gccID string, j elfJob) string {
	h := sha256.New()
	for _, s := range []string{"simnode-elf/v1", gccID, strings.Join(cflags, " "), strings.Join(j.args, "\x00"), j.source} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// buildELF returns the path of the cached output of j, compiling it first
// with tc's gcc when the cache does not have it. Concurrent callers
// (goroutines or processes) may both compile; each writes a private file
// and renames it into place, so the cache never holds a partial file.
func buildELF(dir string, tc *toolchain, j elfJob) (string, error) {
	path := tc.gcc
	out := filepath.Join(dir, cacheKey(tc.gccID, j)+"-"+j.name)
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	work, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	src := filepath.Join(work, "sim.c")
	if err := os.WriteFile(src, []byte(j.source), 0o644); err != nil {
		return "", err
	}
	tmp := filepath.Join(work, j.name)
	args := append(append(append([]string{}, cflags...), j.args...), "-o", tmp, src)
	cmd := exec.Command(path, args...)
	cmd.Dir = work
	var stderr bytes.Buffer
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("simnode: gcc %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	return out, nil
}

// buildAll builds jobs in parallel with tc's gcc and returns the cached
// path of each, indexed like jobs.
func buildAll(dir string, tc *toolchain, jobs []elfJob) ([]string, error) {
	paths := make([]string, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			paths[i], errs[i] = buildELF(dir, tc, j)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return paths, nil
}
