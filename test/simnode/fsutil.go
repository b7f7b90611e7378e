package simnode

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// writeFile writes data to path atomically (temporary file + rename), with
// mode perm regardless of the umask, creating the parent directories.
func writeFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".simnode-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// copyFile copies src to dst atomically with mode perm.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".simnode-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := io.Copy(f, in); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// symlink makes path a symlink to target, atomically replacing whatever
// non-directory is there.
func symlink(target, path string) error {
	if cur, err := os.Readlink(path); err == nil && cur == target {
		return nil
	}
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".simnode-link-%d-%s", os.Getpid(), filepath.Base(path)))
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// layoutBase creates the merged-/usr skeleton: usr/{lib,lib64,bin}, etc and
// the relative symlinks lib -> usr/lib and lib64 -> usr/lib64. An existing
// real lib or lib64 directory is left alone.
func layoutBase(root string) error {
	for _, d := range []string{"usr/lib", "usr/lib64", "usr/bin", "etc", "dev", "proc", "sys"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	for _, l := range []struct{ name, target string }{{"lib", "usr/lib"}, {"lib64", "usr/lib64"}} {
		p := filepath.Join(root, l.name)
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Symlink(l.target, p); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&os.ModeSymlink != 0:
			if err := symlink(l.target, p); err != nil {
				return err
			}
		}
	}
	return nil
}
