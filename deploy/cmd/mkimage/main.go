// Command mkimage writes nri-gpu's release image as an OCI archive, with no
// container engine (make image runs it; see docs/install.md):
//
//	mkimage -binary bin/image/nri-gpu -version 0.1.0 -epoch 1700000000 -o bin/nri-gpu-image.tar
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nri-gpu/nri-gpu/deploy/image"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	binary := fs.String("binary", "", "nri-gpu built for the image (CGO_ENABLED=0, -X main.Version=VERSION)")
	version := fs.String("version", "", "the image's version: its tag, and what the binary must report")
	ref := fs.String("ref", "", "the image's name (default "+image.Repository+":VERSION)")
	epoch := fs.String("epoch", "", "every time in the image, in seconds since 1970 (SOURCE_DATE_EPOCH; make image: the commit's time)")
	libcRoot := fs.String("libc-root", "/", "the root whose Debian libc6 files go into the image (a directory a libc6 .deb was unpacked into with dpkg-deb -x, for a pinned glibc)")
	out := fs.String("o", "bin/nri-gpu-image.tar", "the archive to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *binary == "" || *version == "" || *epoch == "" {
		return fmt.Errorf("-binary, -version and -epoch are required")
	}
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil || secs < 0 {
		return fmt.Errorf("-epoch %q: want seconds since 1970, a number >= 0", *epoch)
	}
	if *ref == "" {
		*ref = image.Reference(*version)
	}
	start := time.Now()
	b, err := image.Build(image.Spec{Binary: *binary, Version: *version, LibcRoot: *libcRoot, Created: time.Unix(secs, 0).UTC()})
	if err != nil {
		return err
	}
	if err := image.WriteArchiveFile(*out, b, *ref); err != nil {
		return err
	}
	digest, err := b.Image.Digest()
	if err != nil {
		return err
	}
	st, err := os.Stat(*out)
	if err != nil {
		return err
	}
	glibc := b.Glibc.Version
	if glibc == "" {
		glibc = "(libc6 version unknown)"
	}
	fmt.Printf("%s: %s %s, %d bytes, glibc %s, built in %s\n", *out, *ref, digest, st.Size(), glibc, time.Since(start).Round(time.Millisecond))
	return nil
}
