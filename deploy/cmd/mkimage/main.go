// Command mkimage writes nri-gpu's release image as an OCI archive, with no
// container engine: an image index with one image per platform (make image
// runs it; see docs/install.md):
//
//	mkimage -version 0.1.0 -epoch 1700000000 -o bin/nri-gpu-image.tar \
//		-binary amd64=bin/image/amd64/nri-gpu -libc-root amd64=/ \
//		-binary arm64=bin/image/arm64/nri-gpu -libc-root arm64=bin/libc6-arm64
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nri-gpu/nri-gpu/deploy/image"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// archPaths is a repeated flag of ARCH=PATH pairs.
type archPaths struct {
	name  string
	order []string
	paths map[string]string
}

func (a *archPaths) String() string {
	var s []string
	for _, k := range a.order {
		s = append(s, k+"="+a.paths[k])
	}
	return strings.Join(s, ",")
}

func (a *archPaths) Set(v string) error {
	arch, p, ok := strings.Cut(v, "=")
	if !ok || arch == "" || p == "" {
		return fmt.Errorf("%q: want ARCH=PATH (amd64=..., arm64=...)", v)
	}
	if _, err := image.PlatformOf(arch); err != nil {
		return err
	}
	if _, dup := a.paths[arch]; dup {
		return fmt.Errorf("-%s %s given twice", a.name, arch)
	}
	a.order = append(a.order, arch)
	a.paths[arch] = p
	return nil
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	binaries := &archPaths{name: "binary", paths: map[string]string{}}
	libcRoots := &archPaths{name: "libc-root", paths: map[string]string{}}
	fs.Var(binaries, "binary", "ARCH=PATH, once per platform of the image: nri-gpu built for it (CGO_ENABLED=0 GOARCH=ARCH, -X main.Version=VERSION)")
	fs.Var(libcRoots, "libc-root", "ARCH=DIR: the root whose Debian libc6:ARCH files go into that platform's image (default /, the build machine's installed libc6; or a directory a libc6 .deb was unpacked into with dpkg-deb -x)")
	version := fs.String("version", "", "the image's version: its tag, and what the binary must report")
	ref := fs.String("ref", "", "the image's name (default "+image.Repository+":VERSION)")
	epoch := fs.String("epoch", "", "every time in the image, in seconds since 1970 (SOURCE_DATE_EPOCH; make image: the commit's time)")
	out := fs.String("o", "bin/nri-gpu-image.tar", "the archive to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(binaries.order) == 0 || *version == "" || *epoch == "" {
		return fmt.Errorf("-binary, -version and -epoch are required")
	}
	for _, arch := range libcRoots.order {
		if _, ok := binaries.paths[arch]; !ok {
			return fmt.Errorf("-libc-root %s: no -binary %s", arch, arch)
		}
	}
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil || secs < 0 {
		return fmt.Errorf("-epoch %q: want seconds since 1970, a number >= 0", *epoch)
	}
	if *ref == "" {
		*ref = image.Reference(*version)
	}
	start := time.Now()
	var specs []image.Spec
	for _, p := range image.Platforms {
		bin, ok := binaries.paths[p.Arch]
		if !ok {
			continue
		}
		root := libcRoots.paths[p.Arch]
		if root == "" {
			root = "/"
		}
		specs = append(specs, image.Spec{Arch: p.Arch, Binary: bin, Version: *version, LibcRoot: root, Created: time.Unix(secs, 0).UTC()})
	}
	r, err := image.BuildRelease(specs)
	if err != nil {
		return err
	}
	if err := image.WriteArchiveFile(*out, r, *ref); err != nil {
		return err
	}
	st, err := os.Stat(*out)
	if err != nil {
		return err
	}
	var platforms []string
	for _, b := range r.Images {
		glibc := b.Glibc.Version
		if glibc == "" {
			glibc = "(libc6 version unknown)"
		}
		platforms = append(platforms, fmt.Sprintf("%s glibc %s", b.Platform, glibc))
	}
	fmt.Printf("%s: %s %s, %d bytes, %s, built in %s\n", *out, *ref, r.Digest, st.Size(), strings.Join(platforms, ", "), time.Since(start).Round(time.Millisecond))
	return nil
}
