// Package images holds the sources of the programs built into the e2e test images.
package images

import _ "embed"

// GPUCheckC is the source of /usr/local/bin/gpucheck: it dlopens libcuda.so.1 and
// libnvidia-ml.so.1 (and optionally libapp.so.1) and prints one line per step.
//
//go:embed gpucheck.c
var GPUCheckC []byte

// LibAppC is the source of libapp.so.1, an image's own library found through the
// image's LD_LIBRARY_PATH.
//
//go:embed libapp.c
var LibAppC []byte
