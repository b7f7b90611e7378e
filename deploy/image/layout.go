// Package image assembles nri-gpu's release image (make image) without a
// container engine: an image index with one image per platform (linux/amd64,
// linux/arm64), each the binary, glibc's loader and the few glibc libraries
// it and the driver's NVML need, in one layer, and the configuration the
// DaemonSet runs (entrypoint, user, environment, labels). The same inputs
// give the same bytes: fixed times, owners, modes and file order.
// deploy/Dockerfile describes the linux/amd64 image for builders with Docker.
package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Paths and settings of the image; deploy/Dockerfile names the same.
const (
	// BinaryPath is where nri-gpu lives in the image: the entrypoint,
	// and on PATH for kubectl exec ... -- nri-gpu status.
	BinaryPath = "/usr/bin/nri-gpu"
	// User is the image's user: root, as the DaemonSet's runAsUser (the
	// NRI socket's directory is 0700 root); the DaemonSet drops every
	// capability.
	User = "0:0"
	// Repository is the image's name without its tag.
	Repository = "ghcr.io/nri-gpu/nri-gpu"
	// Description is the chart's description, the image's label.
	Description = "NVIDIA GPUs for containers through NRI (containerd, CRI-O), without a runtime wrapper."
	// Source is the repository the image is built from.
	Source = "https://github.com/nri-gpu/nri-gpu"
)

// Platform is one platform of the image and where Debian puts glibc for
// it.
type Platform struct {
	// Arch is the architecture as Go (GOARCH), Debian (dpkg) and OCI name
	// it: amd64, arm64.
	Arch string
	// Variant is OCI's variant, which registries list for arm64 ("v8").
	Variant string
	// Machine is the ELF machine of the binary and of glibc's files.
	Machine elf.Machine
	// Triplet is Debian's multiarch directory name: x86_64-linux-gnu.
	Triplet string
	// Loader is glibc's loader, the path the binary names (PT_INTERP).
	Loader string
}

// Platforms are the platforms make image builds, in the index's order.
var Platforms = []Platform{
	{Arch: "amd64", Machine: elf.EM_X86_64, Triplet: "x86_64-linux-gnu", Loader: "/lib64/ld-linux-x86-64.so.2"},
	{Arch: "arm64", Variant: "v8", Machine: elf.EM_AARCH64, Triplet: "aarch64-linux-gnu", Loader: "/lib/ld-linux-aarch64.so.1"},
}

// PlatformOf returns the platform of the architecture arch.
func PlatformOf(arch string) (Platform, error) {
	for _, p := range Platforms {
		if p.Arch == arch {
			return p, nil
		}
	}
	return Platform{}, fmt.Errorf("architecture %q: the image is built for %s", arch, platformNames())
}

// LibDir is where the platform's glibc libraries go: the first directory
// of the loader's built-in search path (Debian's multiarch directory), so
// the image needs no /etc/ld.so.cache.
func (p Platform) LibDir() string { return "/lib/" + p.Triplet }

// OCI is the platform as the image index and the configuration name it.
func (p Platform) OCI() v1.Platform {
	return v1.Platform{OS: "linux", Architecture: p.Arch, Variant: p.Variant}
}

// String is the platform as OCI tools write it: linux/arm64/v8.
func (p Platform) String() string {
	s := "linux/" + p.Arch
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// Entrypoint is the image's entrypoint; the DaemonSet gives the arguments.
var Entrypoint = []string{BinaryPath}

// Env is the image's environment: the conventional PATH (what BuildKit
// gives an image built FROM scratch), so that commands run in the
// container find nri-gpu whatever the runtime's default.
var Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// nvmlLibraries are glibc libraries the image holds although nri-gpu does
// not name them: the driver's libnvidia-ml.so.1, which nri-gpu dlopens from
// the driver root, is linked against glibc's libraries (libc, libdl,
// libpthread, libm; older drivers also librt), and its DT_NEEDED entries are
// resolved from the image, not from the driver root. Without one of them
// the dlopen fails and nri-gpu runs without NVML (no MIG devices, no XID
// health).
var nvmlLibraries = []string{"libm.so.6", "librt.so.1"}

// Labels are the image's labels for a version.
func Labels(version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "nri-gpu",
		"org.opencontainers.image.description": Description,
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.version":     version,
	}
}

// File is one regular file of the image.
type File struct {
	Path   string      // absolute path in the image
	Source string      // the file it is copied from on the build machine
	Mode   fs.FileMode // permission bits
}

// Glibc says where the image's glibc comes from.
type Glibc struct {
	// Root is the file system root whose Debian libc6 files are copied:
	// "/" (the build machine's own), or a directory a libc6 package was
	// unpacked into (dpkg-deb -x).
	Root string
	// Version is libc6's version: from Root's dpkg database, else from
	// the package's changelog (an unpacked package); empty when Root has
	// neither.
	Version string
}

// libDirs are where Debian's libc6 puts the platform's libraries under a
// root: the multiarch directory before (bookworm) and after (trixie) the
// move to /usr.
func (p Platform) libDirs() []string {
	return []string{"lib/" + p.Triplet, "usr/lib/" + p.Triplet}
}

// Files returns the platform's regular files of the image for the nri-gpu
// binary at binary: the binary, its program interpreter at the path the
// binary names, and the glibc libraries it and NVML need, taken from the
// platform's libc6 files under libcRoot. It refuses a library that
// differs from what libcRoot's dpkg database says libc6 installed, and a
// binary that is not a dynamically linked executable of the platform
// naming its glibc loader.
func Files(p Platform, binary, libcRoot string) ([]File, Glibc, error) {
	g := Glibc{Root: libcRoot}
	interp, needed, err := p.elfDeps(binary)
	if err != nil {
		return nil, g, err
	}
	if interp != p.Loader {
		return nil, g, fmt.Errorf("read ELF file %s: program interpreter %q, want glibc's %s loader %s", binary, interp, p.Arch, p.Loader)
	}
	sums, version, err := dpkgLibc6(libcRoot, p.Arch)
	if err != nil {
		return nil, g, err
	}
	if version == "" {
		if version, err = changelogVersion(libcRoot); err != nil {
			return nil, g, err
		}
	}
	g.Version = version
	loaderSrc, err := p.glibcFile(libcRoot, path.Base(interp), sums)
	if err != nil {
		return nil, g, err
	}
	files := []File{
		{Path: BinaryPath, Source: binary, Mode: 0o755},
		{Path: interp, Source: loaderSrc, Mode: 0o755},
	}
	seen := map[string]bool{path.Base(interp): true}
	queue := append(slices.Clone(needed), nvmlLibraries...)
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] {
			continue
		}
		seen[name] = true
		src, err := p.glibcFile(libcRoot, name, sums)
		if err != nil {
			return nil, g, err
		}
		files = append(files, File{Path: path.Join(p.LibDir(), name), Source: src, Mode: 0o644})
		_, more, err := p.elfDeps(src)
		if err != nil {
			return nil, g, err
		}
		queue = append(queue, more...)
	}
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return files, g, nil
}

// elfDeps returns the program interpreter (empty for a shared library) and
// the DT_NEEDED libraries of the platform's ELF file at p.
func (pl Platform) elfDeps(p string) (interp string, needed []string, err error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", nil, fmt.Errorf("read ELF file %s: %w", p, err)
	}
	defer f.Close()
	if f.Machine != pl.Machine {
		return "", nil, fmt.Errorf("read ELF file %s: machine %s, the %s image needs %s", p, f.Machine, pl.Arch, pl.Machine)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return "", nil, fmt.Errorf("read ELF file %s: interpreter: %w", p, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if needed, err = f.ImportedLibraries(); err != nil {
		return "", nil, fmt.Errorf("read ELF file %s: %w", p, err)
	}
	if f.Type == elf.ET_EXEC && (interp == "" || !path.IsAbs(interp)) {
		return "", nil, fmt.Errorf("read ELF file %s: a static executable; nri-gpu is linked dynamically (NVML through purego needs the C library's loader)", p)
	}
	return interp, needed, nil
}

// glibcFile returns the path under root of the platform's libc6 file
// name, checked against libc6's md5sums when root has a dpkg database
// (sums not nil).
func (p Platform) glibcFile(root, name string, sums map[string]string) (string, error) {
	for _, d := range p.libDirs() {
		rel := d + "/" + name
		src := filepath.Join(root, rel)
		if _, err := os.Stat(src); err != nil {
			continue
		}
		if sums == nil {
			return src, nil
		}
		want, ok := sums[rel]
		if !ok {
			continue
		}
		got, err := md5File(src)
		if err != nil {
			return "", err
		}
		if got != want {
			return "", fmt.Errorf("find glibc file %s: %s differs from what libc6 installed (md5 %s, dpkg says %s)", name, src, got, want)
		}
		return src, nil
	}
	return "", fmt.Errorf("find glibc file %s: not in %s under %s as Debian's libc6:%s installs it", name, strings.Join(p.libDirs(), " or "), root, p.Arch)
}

func md5File(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	s := md5.Sum(b) // what dpkg's md5sums hold
	return hex.EncodeToString(s[:]), nil
}

// dpkgLibc6 reads the md5sums (path relative to root -> md5) and version
// of libc6 for arch from root's dpkg database; nil and "" when root has
// none (a directory a package was unpacked into). A dpkg database without
// libc6 for arch is an error: the files would be another package's.
func dpkgLibc6(root, arch string) (map[string]string, string, error) {
	info := filepath.Join(root, "var/lib/dpkg/info/libc6:"+arch+".md5sums")
	data, err := os.ReadFile(info)
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(root, "var/lib/dpkg/status")); err == nil {
			return nil, "", fmt.Errorf("find libc6:%s: not installed under %s (dpkg has no %s); unpack the package with dpkg-deb -x into a directory and name that one (make image: LIBC_ROOT_%s)", arch, root, info, arch)
		}
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read libc6's md5sums: %w", err)
	}
	sums := map[string]string{}
	for line := range strings.Lines(string(data)) {
		sum, p, ok := strings.Cut(strings.TrimSpace(line), "  ")
		if ok {
			sums[p] = sum
		}
	}
	status, err := os.ReadFile(filepath.Join(root, "var/lib/dpkg/status"))
	if err != nil {
		return nil, "", fmt.Errorf("read dpkg status: %w", err)
	}
	return sums, packageVersion(status, "libc6", arch), nil
}

// changelogVersion is libc6's version from the first line of the
// package's own changelog ("glibc (2.36-9+deb12u14) bookworm-security;
// ..."), which an unpacked package has; empty when root has none.
func changelogVersion(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "usr/share/doc/libc6/changelog.Debian.gz"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read libc6's changelog: %w", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return "", fmt.Errorf("read libc6's changelog: %w", err)
	}
	line, err := bufio.NewReader(zr).ReadString('\n')
	if err != nil && line == "" {
		return "", fmt.Errorf("read libc6's changelog: %w", err)
	}
	_, rest, ok := strings.Cut(line, " (")
	version, _, ok2 := strings.Cut(rest, ")")
	if !ok || !ok2 || !strings.HasPrefix(line, "glibc ") {
		return "", fmt.Errorf("read libc6's changelog: first line %q is not \"glibc (VERSION) ...\"", strings.TrimSpace(line))
	}
	return version, nil
}

// packageVersion returns the Version of the installed package name for
// arch in a dpkg status file, empty when it is not there.
func packageVersion(status []byte, name, arch string) string {
	for stanza := range strings.SplitSeq(string(status), "\n\n") {
		fields := map[string]string{}
		sc := bufio.NewScanner(bytes.NewReader([]byte(stanza)))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ": ")
			if ok && !strings.HasPrefix(k, " ") {
				fields[k] = v
			}
		}
		if fields["Package"] == name && fields["Architecture"] == arch && strings.HasSuffix(fields["Status"], " installed") {
			return fields["Version"]
		}
	}
	return ""
}
