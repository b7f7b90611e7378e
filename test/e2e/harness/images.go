package harness

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/images"
)

// Image names built by BuildImages.
const (
	BusyboxImage  = "localhost/nri-gpu-e2e/busybox:1"
	GlibcImage    = "localhost/nri-gpu-e2e/glibc:1"
	GlibcAppImage = "localhost/nri-gpu-e2e/glibc-app:1"
	// GlibcCUDAImage is the glibc image with NVIDIA_VISIBLE_DEVICES=all in
	// its config, as nvidia/cuda images have (not in Images.All: the
	// cluster imports it).
	GlibcCUDAImage = "localhost/nri-gpu-e2e/glibc-cuda:1"
)

// OCI media types.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// imageFormatVersion is part of every image's cache key: bump it when the way images
// are laid out changes.
const imageFormatVersion = "nri-gpu-e2e-image-v1"

// epoch is the mtime of every file in the built layers, so builds are reproducible.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// File is one entry of an image layer. Exactly one of Data, Source, Symlink or Dir
// says what it is.
type File struct {
	Path    string      // absolute path in the image
	Mode    fs.FileMode // permission bits; default 0644 for files, 0755 for dirs
	Data    []byte      // file content
	Source  string      // or: a host file whose content to copy (symlinks followed)
	Symlink string      // or: a symlink with this target
	Dir     bool        // or: a directory
	UID     int
	GID     int
}

// ImageSpec describes a single-layer image.
type ImageSpec struct {
	Name       string // full reference, e.g. localhost/nri-gpu-e2e/busybox:1
	Files      []File // parent directories are created as needed
	Env        []string
	Entrypoint []string
	Cmd        []string
	WorkingDir string
	User       string
	Labels     map[string]string
}

// Image is a built image: an OCI image layout in a tar file, importable with
// `ctr images import`.
type Image struct {
	Name           string `json:"name"`
	Tar            string `json:"tar"`
	ManifestDigest string `json:"manifestDigest"`
	ConfigDigest   string `json:"configDigest"` // the image ID CRI reports
	// IndexDigest is the digest of the image index of a multi-platform
	// image (the release image), whose ManifestDigest and ConfigDigest
	// are those of this machine's platform; empty for a single image.
	IndexDigest string `json:"indexDigest,omitempty"`
}

// Images are the images BuildImages builds.
type Images struct {
	// Busybox: Debian's busybox-static with its applets in /bin; default command
	// `sleep 3600`. Also the sandbox (pause) image.
	Busybox *Image
	// Glibc: a Debian-like merged-/usr image with the host's glibc, busybox and
	// /usr/local/bin/gpucheck; default command `sleep 3600`.
	Glibc *Image
	// GlibcApp: Glibc plus its own /opt/app/lib/libapp.so.1 and
	// LD_LIBRARY_PATH=/opt/app/lib in the image config.
	GlibcApp *Image
	// GlibcCUDA: Glibc with NVIDIA_VISIBLE_DEVICES=all in its config, as
	// nvidia/cuda images have. Not in All: the cluster imports it.
	GlibcCUDA *Image
}

// All returns every image but GlibcCUDA.
func (i *Images) All() []*Image {
	return []*Image{i.Busybox, i.Glibc, i.GlibcApp}
}

// BuildImages builds the standard images into dir (created if needed; an empty dir
// means <DefaultCacheDir()>/images). Built images are cached by content hash: a
// second call with the same inputs only hashes them.
//
// It needs Debian's busybox-static (installed with apt-get when /bin/busybox is
// missing), gcc, and the host's glibc.
func BuildImages(ctx context.Context, dir string) (*Images, error) {
	if dir == "" {
		dir = filepath.Join(DefaultCacheDir(), "images")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, ".build.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	busybox, err := ensureBusybox(ctx)
	if err != nil {
		return nil, err
	}
	applets, err := busyboxApplets(ctx, busybox)
	if err != nil {
		return nil, err
	}
	bin, err := compilePrograms(ctx, dir)
	if err != nil {
		return nil, err
	}

	res := &Images{}
	bb := ImageSpec{
		Name:  BusyboxImage,
		Files: append(baseFiles(), busyboxFiles(busybox, "/bin", applets)...),
		Env:   []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Cmd:   []string{"sleep", "3600"},
	}
	if res.Busybox, err = BuildImage(dir, bb); err != nil {
		return nil, err
	}

	glibc, err := glibcFiles(bin.gpucheck)
	if err != nil {
		return nil, err
	}
	gl := ImageSpec{
		Name:  GlibcImage,
		Files: append(append(append(baseFiles(), mergedUsrFiles()...), busyboxFiles(busybox, "/usr/bin", applets)...), glibc...),
		Env:   []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Cmd:   []string{"sleep", "3600"},
	}
	gl.Files = append(gl.Files, File{Path: "/usr/local/bin/gpucheck", Source: bin.gpucheck, Mode: 0o755})
	ldconf := []File{
		{Path: "/etc/ld.so.conf", Data: []byte("include /etc/ld.so.conf.d/*.conf\n")},
		{Path: "/etc/ld.so.conf.d/x86_64-linux-gnu.conf", Data: []byte("# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")},
	}
	gl.Files = append(gl.Files, ldconf...)
	cache, err := ldsoCache(ctx, dir, append(glibc, ldconf...))
	if err != nil {
		return nil, err
	}
	if cache != nil {
		gl.Files = append(gl.Files, File{Path: "/etc/ld.so.cache", Data: cache})
	}
	if res.Glibc, err = BuildImage(dir, gl); err != nil {
		return nil, err
	}

	cuda := gl
	cuda.Name = GlibcCUDAImage
	cuda.Env = append(append([]string(nil), gl.Env...), "NVIDIA_VISIBLE_DEVICES=all")
	if res.GlibcCUDA, err = BuildImage(dir, cuda); err != nil {
		return nil, err
	}

	app := gl
	app.Name = GlibcAppImage
	app.Files = append(append([]File(nil), gl.Files...),
		File{Path: "/opt/app/lib/libapp.so.1", Source: bin.libapp, Mode: 0o755})
	app.Env = append(append([]string(nil), gl.Env...), "LD_LIBRARY_PATH=/opt/app/lib")
	if res.GlibcApp, err = BuildImage(dir, app); err != nil {
		return nil, err
	}
	return res, nil
}

// baseFiles are the directories and files every image gets.
func baseFiles() []File {
	return []File{
		{Path: "/dev", Dir: true},
		{Path: "/proc", Dir: true, Mode: 0o555},
		{Path: "/sys", Dir: true, Mode: 0o555},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/root", Dir: true, Mode: 0o700},
		{Path: "/run", Dir: true},
		{Path: "/var/tmp", Dir: true, Mode: 0o1777},
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nvideo:x:44:\nnogroup:x:65534:\n")},
	}
}

// mergedUsrFiles lays out a Debian 12 style merged /usr.
func mergedUsrFiles() []File {
	return []File{
		{Path: "/bin", Symlink: "usr/bin"},
		{Path: "/sbin", Symlink: "usr/sbin"},
		{Path: "/lib", Symlink: "usr/lib"},
		{Path: "/lib64", Symlink: "usr/lib64"},
		{Path: "/usr/sbin", Dir: true},
		{Path: "/usr/local/bin", Dir: true},
		{Path: "/usr/lib/x86_64-linux-gnu", Dir: true},
		{Path: "/etc/debian_version", Data: []byte("12.0\n")},
		{Path: "/etc/os-release", Data: []byte("PRETTY_NAME=\"nri-gpu e2e (Debian-like)\"\nID=debian\nVERSION_ID=\"12\"\n")},
	}
}

func busyboxFiles(busybox, binDir string, applets []string) []File {
	files := []File{{Path: path.Join(binDir, "busybox"), Source: busybox, Mode: 0o755}}
	for _, a := range applets {
		if a == "busybox" {
			continue
		}
		files = append(files, File{Path: path.Join(binDir, a), Symlink: "busybox"})
	}
	return files
}

// requiredApplets must exist in the busybox images.
var requiredApplets = []string{"sh", "ls", "cat", "stat", "sleep", "env", "id", "test", "head", "grep", "find", "readlink", "wc", "hexdump", "mount", "echo", "true", "false"}

// moreApplets get a symlink too when busybox has them. Not all ~270: every entry
// of a layer costs unpack time (about 1 ms a file on the CI VMs), and
// `busybox <applet>` reaches the rest.
var moreApplets = []string{"[", "ash", "awk", "basename", "cp", "cut", "date", "dd", "df", "dirname", "du", "chmod", "chown", "expr",
	"hostname", "kill", "ln", "md5sum", "mkdir", "mknod", "mv", "nproc", "od", "printf", "ps", "pwd", "realpath", "rm", "rmdir",
	"sed", "seq", "sha256sum", "sort", "tail", "tee", "timeout", "touch", "tr", "umount", "uname", "uniq", "which", "whoami", "xargs", "yes"}

// ensureBusybox returns the path of a static busybox, installing Debian's
// busybox-static when /bin/busybox is missing.
func ensureBusybox(ctx context.Context) (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if isStatic(p) {
			return p, nil
		}
	}
	if err := aptInstall(ctx, "busybox-static"); err != nil {
		return "", fmt.Errorf("no static /bin/busybox: %w", err)
	}
	if !isStatic("/bin/busybox") {
		return "", errors.New("/bin/busybox is not a static binary even after installing busybox-static")
	}
	return "/bin/busybox", nil
}

// isStatic reports whether p is an ELF executable without a program interpreter.
func isStatic(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

func busyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	have := map[string]bool{}
	for _, a := range strings.Fields(string(out)) {
		have[a] = true
	}
	var applets []string
	for _, a := range requiredApplets {
		if !have[a] {
			return nil, fmt.Errorf("%s lacks the %q applet", busybox, a)
		}
		applets = append(applets, a)
	}
	for _, a := range moreApplets {
		if have[a] {
			applets = append(applets, a)
		}
	}
	sort.Strings(applets)
	return applets, nil
}

type programs struct {
	gpucheck string
	libapp   string
}

// compilePrograms builds gpucheck and libapp.so.1 with gcc into
// dir/bin-<hash of sources and compiler>, reusing an earlier build.
func compilePrograms(ctx context.Context, dir string) (*programs, error) {
	ver, err := exec.CommandContext(ctx, "gcc", "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("gcc is needed to build the test images: %w", err)
	}
	h := sha256.New()
	for _, b := range [][]byte{[]byte(imageFormatVersion), ver, images.GPUCheckC, images.LibAppC} {
		fmt.Fprintf(h, "%d\n", len(b))
		h.Write(b)
	}
	out := filepath.Join(dir, "bin-"+hex.EncodeToString(h.Sum(nil))[:16])
	p := &programs{gpucheck: filepath.Join(out, "gpucheck"), libapp: filepath.Join(out, "libapp.so.1")}
	if isExecutable(p.gpucheck) && isExecutable(p.libapp) {
		return p, nil
	}
	tmp, err := os.MkdirTemp(dir, ".bin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for name, src := range map[string][]byte{"gpucheck.c": images.GPUCheckC, "libapp.c": images.LibAppC} {
		if err := os.WriteFile(filepath.Join(tmp, name), src, 0o644); err != nil {
			return nil, err
		}
	}
	gcc := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "gcc", args...)
		cmd.Dir = tmp
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("gcc %s: %w\n%s", strings.Join(args, " "), err, b)
		}
		return nil
	}
	// glibc >= 2.34 has dlopen in libc; older ones need -ldl.
	if err := gcc("-O2", "-Wall", "-o", "gpucheck", "gpucheck.c"); err != nil {
		if err2 := gcc("-O2", "-Wall", "-o", "gpucheck", "gpucheck.c", "-ldl"); err2 != nil {
			return nil, err
		}
	}
	if err := gcc("-O2", "-Wall", "-shared", "-fPIC", "-Wl,-soname,libapp.so.1", "-o", "libapp.so.1", "libapp.c"); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(out); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, out); err != nil {
		return nil, err
	}
	if err := os.Chmod(out, 0o755); err != nil {
		return nil, err
	}
	return p, nil
}

// glibcFiles returns the host's dynamic loader and the libraries prog needs
// (transitively), placed like Debian 12 does: in /usr/lib/x86_64-linux-gnu, with
// /usr/lib64/ld-linux-x86-64.so.2 a symlink to the loader there.
func glibcFiles(prog string) ([]File, error) {
	const libDir = "/usr/lib/x86_64-linux-gnu"
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("the glibc image is only built for amd64, not %s", runtime.GOARCH)
	}
	interp, err := elfInterp(prog)
	if err != nil {
		return nil, err
	}
	loader := path.Base(interp) // ld-linux-x86-64.so.2
	files := []File{
		{Path: path.Join(libDir, loader), Source: interp, Mode: 0o755},
		{Path: path.Join("/usr/lib64", loader), Symlink: "../lib/x86_64-linux-gnu/" + loader},
	}
	searchDirs := []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
	seen := map[string]bool{loader: true}
	queue := []string{prog}
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		needed, err := elfNeeded(f)
		if err != nil {
			return nil, err
		}
		for _, n := range needed {
			if seen[n] {
				continue
			}
			seen[n] = true
			var src string
			for _, d := range searchDirs {
				if _, err := os.Stat(filepath.Join(d, n)); err == nil {
					src = filepath.Join(d, n)
					break
				}
			}
			if src == "" {
				return nil, fmt.Errorf("%s needs %s, not found on the host", f, n)
			}
			files = append(files, File{Path: path.Join(libDir, n), Source: src, Mode: 0o755})
			queue = append(queue, src)
		}
	}
	if !seen["libc.so.6"] {
		src := "/lib/x86_64-linux-gnu/libc.so.6"
		files = append(files, File{Path: path.Join(libDir, "libc.so.6"), Source: src, Mode: 0o755})
	}
	return files, nil
}

// ldsoCache runs the host's ldconfig on a scratch root holding files (and the merged
// /usr symlinks) and returns the /etc/ld.so.cache it wrote: like a real Debian image,
// the cache lists glibc and nothing else. Nil without an ldconfig.
func ldsoCache(ctx context.Context, dir string, files []File) ([]byte, error) {
	ldconfig := ""
	for _, p := range []string{"/sbin/ldconfig", "/usr/sbin/ldconfig"} {
		if isExecutable(p) {
			ldconfig = p
			break
		}
	}
	if ldconfig == "" {
		Logf("no ldconfig on the host: the glibc image gets no /etc/ld.so.cache")
		return nil, nil
	}
	root, err := os.MkdirTemp(dir, ".root-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	files = append(mergedUsrFiles(), files...)
	for _, f := range files {
		p := filepath.Join(root, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		switch {
		case f.Dir:
			err = os.MkdirAll(p, 0o755)
		case f.Symlink != "":
			err = os.Symlink(f.Symlink, p)
		case f.Source != "":
			var b []byte
			if b, err = os.ReadFile(f.Source); err == nil {
				err = os.WriteFile(p, b, 0o755)
			}
		default:
			err = os.WriteFile(p, f.Data, 0o644)
		}
		if err != nil {
			return nil, err
		}
	}
	// -X: no symlinks written into the scratch root; only the cache is wanted.
	if out, err := exec.CommandContext(ctx, ldconfig, "-X", "-r", root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ldconfig -r: %w\n%s", err, out)
	}
	return os.ReadFile(filepath.Join(root, "etc", "ld.so.cache"))
}

func elfInterp(p string) (string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return "", err
			}
			return strings.TrimRight(string(b), "\x00"), nil
		}
	}
	return "", fmt.Errorf("%s has no program interpreter", p)
}

func elfNeeded(p string) ([]string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return libs, nil
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// BuildImage writes spec as an OCI image layout tar into dir, named after the image
// and the hash of its content; an image already built from the same content is
// reused.
func BuildImage(dir string, spec ImageSpec) (*Image, error) {
	if spec.Name == "" {
		return nil, errors.New("image spec without a name")
	}
	entries, err := layerEntries(spec.Files)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", spec.Name, err)
	}
	// Cache key: everything that goes into the image.
	h := sha256.New()
	meta, _ := json.Marshal(struct {
		V    string
		Spec ImageSpec
		Arch string
	}{imageFormatVersion, ImageSpec{Name: spec.Name, Env: spec.Env, Entrypoint: spec.Entrypoint, Cmd: spec.Cmd, WorkingDir: spec.WorkingDir, User: spec.User, Labels: spec.Labels}, runtime.GOARCH})
	h.Write(meta)
	for _, e := range entries {
		fmt.Fprintf(h, "\n%s %o %d %d %q %v %d\n", e.path, e.mode, e.uid, e.gid, e.symlink, e.dir, len(e.data))
		h.Write(e.data)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	base := filepath.Join(dir, unsafeName.ReplaceAllString(spec.Name, "_")+"-"+key)
	if b, err := os.ReadFile(base + ".json"); err == nil {
		var img Image
		if json.Unmarshal(b, &img) == nil && img.Tar == base+".tar" {
			if _, err := os.Stat(img.Tar); err == nil {
				return &img, nil
			}
		}
	}

	layer, diffID, err := buildLayer(entries)
	if err != nil {
		return nil, err
	}
	config := map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config": map[string]any{
			"Env":        spec.Env,
			"Entrypoint": spec.Entrypoint,
			"Cmd":        spec.Cmd,
			"WorkingDir": spec.WorkingDir,
			"User":       spec.User,
			"Labels":     spec.Labels,
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{diffID},
		},
		"history": []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "nri-gpu e2e harness"}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return nil, err
	}
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaTypeManifest,
		"config":        descriptor(mediaTypeConfig, configJSON),
		"layers":        []any{descriptor(mediaTypeLayer, layer)},
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return nil, err
	}
	tag := spec.Name[strings.LastIndex(spec.Name, ":")+1:]
	mdesc := descriptor(mediaTypeManifest, manifestJSON)
	mdesc["annotations"] = map[string]string{
		"io.containerd.image.name":          spec.Name,
		"org.opencontainers.image.ref.name": tag,
	}
	mdesc["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaTypeIndex,
		"manifests":     []any{mdesc},
	})
	if err != nil {
		return nil, err
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, blob := range [][]byte{layer, configJSON, manifestJSON} {
		if err := add("blobs/sha256/"+sha256Hex(blob), blob); err != nil {
			return nil, err
		}
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return nil, err
	}
	if err := add("index.json", index); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	img := &Image{
		Name:           spec.Name,
		Tar:            base + ".tar",
		ManifestDigest: "sha256:" + sha256Hex(manifestJSON),
		ConfigDigest:   "sha256:" + sha256Hex(configJSON),
	}
	if err := writeFileAtomic(img.Tar, buf.Bytes()); err != nil {
		return nil, err
	}
	sidecar, _ := json.MarshalIndent(img, "", "  ")
	if err := writeFileAtomic(base+".json", sidecar); err != nil {
		return nil, err
	}
	return img, nil
}

func descriptor(mediaType string, blob []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": "sha256:" + sha256Hex(blob), "size": len(blob)}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

type layerEntry struct {
	path     string // without leading slash
	mode     fs.FileMode
	uid, gid int
	data     []byte
	symlink  string
	dir      bool
}

// layerEntries resolves files (reading Source files), adds missing parent
// directories and sorts by path. A later File for the same path wins.
func layerEntries(files []File) ([]layerEntry, error) {
	byPath := map[string]layerEntry{}
	for _, f := range files {
		p := strings.TrimPrefix(path.Clean("/"+f.Path), "/")
		if p == "" {
			continue
		}
		e := layerEntry{path: p, mode: f.Mode.Perm() | f.Mode&(fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid), uid: f.UID, gid: f.GID}
		switch {
		case f.Dir:
			e.dir = true
			if f.Mode == 0 {
				e.mode = 0o755
			}
		case f.Symlink != "":
			e.symlink = f.Symlink
			e.mode = 0o777
		case f.Source != "":
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return nil, err
			}
			e.data = b
			if f.Mode == 0 {
				st, err := os.Stat(f.Source)
				if err != nil {
					return nil, err
				}
				e.mode = st.Mode().Perm()
			}
		default:
			e.data = f.Data
			if f.Mode == 0 {
				e.mode = 0o644
			}
		}
		byPath[p] = e
	}
	// Parent directories, unless a symlink already stands for them.
	for p := range byPath {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = layerEntry{path: d, dir: true, mode: 0o755}
			}
		}
	}
	var out []layerEntry
	for _, e := range byPath {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	// A path under a symlink would be written through it by the unpacker: refuse.
	for _, e := range out {
		for d := path.Dir(e.path); d != "."; d = path.Dir(d) {
			if parent := byPath[d]; parent.symlink != "" {
				return nil, fmt.Errorf("/%s is under the symlink /%s", e.path, d)
			}
		}
	}
	return out, nil
}

// buildLayer writes a gzip-compressed tar of entries and returns it with its diff ID
// (the digest of the uncompressed tar).
func buildLayer(entries []layerEntry) ([]byte, string, error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.path, Mode: int64(e.mode.Perm()), Uid: e.uid, Gid: e.gid, ModTime: epoch, Format: tar.FormatPAX}
		if e.mode&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		if e.mode&fs.ModeSetgid != 0 {
			hdr.Mode |= 0o2000
		}
		if e.mode&fs.ModeSetuid != 0 {
			hdr.Mode |= 0o4000
		}
		switch {
		case e.dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, e.path+"/"
		case e.symlink != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.symlink
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, "", err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				return nil, "", err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if err != nil {
		return nil, "", err
	}
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), "sha256:" + sha256Hex(raw.Bytes()), nil
}

func writeFileAtomic(p string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-"+filepath.Base(p)+"-")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

func goarch() string { return runtime.GOARCH }
