package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// tree is a parsed TOML document.
type tree = map[string]any

// get returns the value at the dotted path of keys in t.
func get(t tree, keys ...string) (any, bool) {
	var cur any = t
	for _, k := range keys {
		m, ok := cur.(tree)
		if !ok {
			return nil, false
		}
		if cur, ok = m[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func getTable(t tree, keys ...string) (tree, bool) {
	v, ok := get(t, keys...)
	m, isTable := v.(tree)
	return m, ok && isTable
}

func getString(t tree, keys ...string) string {
	v, _ := get(t, keys...)
	s, _ := v.(string)
	return s
}

func getBool(t tree, keys ...string) (value, set bool) {
	v, ok := get(t, keys...)
	b, isBool := v.(bool)
	return b, ok && isBool
}

func getStrings(t tree, keys ...string) []string {
	v, _ := get(t, keys...)
	list, _ := v.([]any)
	var out []string
	for _, e := range list {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// merge merges src into dst, tables key by key, src winning elsewhere.
func merge(dst, src tree) {
	for k, v := range src {
		if st, ok := v.(tree); ok {
			if dt, ok := dst[k].(tree); ok {
				merge(dt, st)
				continue
			}
		}
		dst[k] = v
	}
}

func readTOML(path string) (tree, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t := tree{}
	if err := toml.Unmarshal(data, &t); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return nil, fmt.Errorf("%s:%d:%d: %v", path, row, col, err)
		}
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return t, nil
}

// containerdConfig is containerd's configuration, merged from its main file
// and its imports.
type containerdConfig struct {
	Files   []string // read, in order
	Version int64
	Tree    tree
	// V3Imports are imported files of config version 3 under a main file
	// of version 2 or less: containerd 2.x reads them, containerd 1.7 does
	// not start ("unsupported config version `3`").
	V3Imports []string
}

// criPlugin is the name of the CRI runtime plugin's table for the config
// version.
func (c *containerdConfig) criRuntime() tree {
	if c.Version >= 3 {
		t, _ := getTable(c.Tree, "plugins", "io.containerd.cri.v1.runtime")
		return t
	}
	t, _ := getTable(c.Tree, "plugins", "io.containerd.grpc.v1.cri")
	return t
}

// nri is the NRI plugin's table, nil when absent.
func (c *containerdConfig) nri() tree {
	t, _ := getTable(c.Tree, "plugins", "io.containerd.nri.v1.nri")
	return t
}

// loadContainerd reads containerd's configuration at path (as this process
// sees it) and the files its imports name, as containerd does: imports are
// host paths (read under hostRoot), relative ones relative to the
// importing file, globs allowed; later files override earlier ones.
func loadContainerd(path, hostRoot string) (*containerdConfig, error) {
	c := &containerdConfig{Tree: tree{}}
	seen := map[string]bool{}
	pending := []string{path}
	for len(pending) > 0 {
		p := pending[0]
		pending = pending[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		t, err := readTOML(p)
		if err != nil {
			return nil, err
		}
		c.Files = append(c.Files, p)
		if v, ok := t["version"].(int64); ok {
			switch {
			case p == path:
				c.Version = v
			case v >= 3 && c.Version <= 2:
				c.V3Imports = append(c.V3Imports, p)
			}
		}
		imports := getStrings(t, "imports")
		delete(t, "imports")
		merge(c.Tree, t)
		for _, imp := range imports {
			if filepath.IsAbs(imp) {
				imp = filepath.Join(hostRoot, imp)
			} else {
				imp = filepath.Join(filepath.Dir(p), imp)
			}
			matches, err := filepath.Glob(imp)
			if err != nil {
				return nil, fmt.Errorf("%s: import %q: %v", p, imp, err)
			}
			sort.Strings(matches)
			pending = append(pending, matches...)
		}
	}
	return c, nil
}

// crioConfig is CRI-O's configuration, merged from its main file and the
// drop-ins of <main>.d.
type crioConfig struct {
	Files []string
	Tree  tree
}

// loadCRIO reads CRI-O's main file (if present) and its drop-in directory
// (files in lexical order, later ones overriding). It returns nil, nil
// when neither exists.
func loadCRIO(path string) (*crioConfig, error) {
	c := &crioConfig{Tree: tree{}}
	files := []string{}
	if _, err := os.Stat(path); err == nil {
		files = append(files, path)
	}
	entries, err := os.ReadDir(path + ".d")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".conf") {
			files = append(files, filepath.Join(path+".d", e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, nil
	}
	for _, f := range files {
		t, err := readTOML(f)
		if err != nil {
			return nil, err
		}
		merge(c.Tree, t)
		c.Files = append(c.Files, f)
	}
	return c, nil
}
