// Command simnode lays out a simulated NVIDIA GPU node (see package
// github.com/nri-gpu/nri-gpu/test/simnode) in a directory, for manual
// experiments with the plugin and its discovery code:
//
//	go run ./test/simnode/cmd/simnode -o /tmp/node -gpus 8 -layout debian
//
// It prints a summary of what it laid out, or the Node as JSON with -json.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

func main() {
	var (
		out         = flag.String("o", "", "directory to lay the node out in (required)")
		gpus        = flag.Int("gpus", simnode.DefaultNumGPUs, "number of GPUs")
		layout      = flag.String("layout", string(simnode.LayoutRHEL), "library layout: rhel or debian")
		driver      = flag.String("driver", simnode.DefaultDriverVersion, "driver version")
		cuda        = flag.Int("cuda", simnode.DefaultCUDAVersion, "CUDA driver API version reported by libcuda (13000 = 13.0)")
		uvm         = flag.Int("uvm-major", simnode.DefaultUVMMajor, "major number of nvidia-uvm")
		swapMinors  = flag.Bool("swap-minors", false, "make device minors differ from the nvidia-smi index order")
		deviceNodes = flag.Bool("device-nodes", false, "create real character devices in dev/ (needs root)")
		noDriver    = flag.Bool("no-driver", false, "lay out the kernel side only (no libraries, binaries, firmware)")
		cache       = flag.String("cache", "", "directory for compiled ELF files (default: user cache dir)")
		asJSON      = flag.Bool("json", false, "print the generated Node as JSON")
		mig         = flag.Bool("mig", false, "MIG on GPUs 0 (7x 1g.10gb) and 1 (3x 2g.20gb + 1x 1g.10gb), with the simulated NVML and nvidia-caps")
	)
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: simnode -o DIR [flags]")
		flag.PrintDefaults()
		os.Exit(2)
	}
	if *gpus == 0 {
		fmt.Fprintln(os.Stderr, "simnode: -gpus must be at least 1")
		os.Exit(2)
	}
	start := time.Now()
	n, err := simnode.Generate(*out, simnode.Options{
		NumGPUs:       *gpus,
		SwapMinors:    *swapMinors,
		DriverVersion: *driver,
		CUDAVersion:   *cuda,
		Layout:        simnode.Layout(*layout),
		UVMMajor:      *uvm,
		DeviceNodes:   *deviceNodes,
		NoDriver:      *noDriver,
		CacheDir:      *cache,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *mig {
		if err := n.SetMIG(simnode.MixedMIG()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(n); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	fmt.Printf("simulated node in %s (%s)\n", n.Root, time.Since(start).Round(time.Millisecond))
	fmt.Printf("driver %s, libraries in %s, nvidia-uvm major %d\n", n.DriverVersion, n.LibDir, n.UVMMajor)
	for _, g := range n.GPUs {
		excluded := ""
		if g.Excluded {
			excluded = " (excluded)"
		}
		fmt.Printf("  GPU %d: %s minor %d %s %s%s\n", g.Index, g.BusID, g.Minor, g.UUID, g.Model, excluded)
	}
	counts := map[string]int{}
	for _, f := range n.Files {
		counts[f.Capability]++
	}
	if len(n.Files) > 0 {
		fmt.Printf("%d driver files:", len(n.Files))
		for _, c := range []string{simnode.CapUtility, simnode.CapCompute, simnode.CapVideo, simnode.CapGraphics, simnode.CapNGX, simnode.CapFirmware} {
			if counts[c] > 0 {
				fmt.Printf(" %s %d", c, counts[c])
			}
		}
		fmt.Println()
	}
}
