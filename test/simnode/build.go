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

var (
	gccOnce sync.Once
	gccPath string
	gccID   string
	gccErr  error
)

// gcc returns the path of gcc and a string identifying the binary (path,
// size, modification time), which is part of every cache key so that a
// compiler upgrade invalidates the cache.
func gcc() (path, id string, err error) {
	gccOnce.Do(func() {
		gccPath, gccErr = exec.LookPath("gcc")
		if gccErr != nil {
			gccErr = fmt.Errorf("simnode: gcc is needed to build the simulated driver (or use Options.NoDriver): %w", gccErr)
			return
		}
		fi, err := os.Stat(gccPath)
		if err != nil {
			gccErr = err
			return
		}
		gccID = fmt.Sprintf("%s\x00%d\x00%d", gccPath, fi.Size(), fi.ModTime().UnixNano())
	})
	return gccPath, gccID, gccErr
}

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
// when the cache does not have it. Concurrent callers (goroutines or
// processes) may both compile; each writes a private file and renames it
// into place, so the cache never holds a partial file.
func buildELF(dir string, j elfJob) (string, error) {
	path, id, err := gcc()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, cacheKey(id, j)+"-"+j.name)
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

// buildAll builds jobs in parallel and returns the cached path of each,
// indexed like jobs.
func buildAll(dir string, jobs []elfJob) ([]string, error) {
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
			paths[i], errs[i] = buildELF(dir, j)
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
