package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdispec"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// cdiCmd runs `nri-gpu cdi generate`.
func cdiCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "generate" {
		return usageError{fmt.Errorf("usage: nri-gpu cdi generate [--config FILE] [-o FILE|-] [--capabilities CAPS] [--kind nvidia.com/gpu|nvidia.com/imex-channel]")}
	}
	fs := flag.NewFlagSet("cdi generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration file (YAML); default: built-in defaults")
	out := fs.String("o", "-", "output file, or - for standard output")
	capsFlag := fs.String("capabilities", inventory.DefaultCapabilities.String(), "driver capabilities whose files the spec mounts (as NVIDIA_DRIVER_CAPABILITIES)")
	kind := fs.String("kind", cdispec.Kind, "the CDI kind of the spec: "+cdispec.Kind+" (the GPUs) or "+cdispec.IMEXKind+" (the IMEX channels, one device per channel number)")
	lf := addLogFlags(fs, "warning")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	if *kind != cdispec.Kind && *kind != cdispec.IMEXKind {
		return usageError{fmt.Errorf("--kind: %q is not a kind nri-gpu exports (valid: %s, %s)", *kind, cdispec.Kind, cdispec.IMEXKind)}
	}
	caps, err := request.ParseCapabilities(*capsFlag)
	if err != nil {
		return usageError{fmt.Errorf("--capabilities: %v", err)}
	}
	if err := checkTarget(*out); err != nil {
		return err
	}
	cfg, err := loadConfig(*cfgPath)
	if err != nil {
		return err
	}
	// A CDI spec can only replace PATH, not append to it: the spec puts
	// the binaries at /usr/bin (layout toolkit), whatever the layout of
	// nri-gpu's own edits.
	cfg.Layout, cfg.BinaryDir = config.LayoutToolkit, ""
	n, err := node.New(cfg, log)
	if err != nil {
		return err
	}
	generate := func() (*specs.Spec, error) { return cdispec.Generate(n.State().Source, caps) }
	if *kind == cdispec.IMEXKind {
		generate = func() (*specs.Spec, error) { return cdispec.GenerateIMEX(n.State().Source) }
	}
	spec, err := generate()
	if err != nil {
		return err
	}
	data, err := cdispec.Marshal(spec)
	if err != nil {
		return err
	}
	if *out == "-" {
		_, err = stdout.Write(data)
		return err
	}
	return writeFile(*out, data)
}

// checkTarget checks, before anything is made, that -o names a file in
// an existing directory.
func checkTarget(out string) error {
	if out == "-" {
		return nil
	}
	dir := filepath.Dir(out)
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		return usageError{fmt.Errorf("-o %s: directory %s: %v", out, dir, pathProblem(err))}
	case !fi.IsDir():
		return usageError{fmt.Errorf("-o %s: %s is not a directory", out, dir)}
	}
	return nil
}

// writeFile writes data to path through a temporary file next to it and
// a rename, so that a runtime watching the directory never reads half a
// spec. Errors name path, not the temporary file.
func writeFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".nri-gpu-cdi-*")
	if err != nil {
		return fmt.Errorf("writing %s: %v", path, pathProblem(err))
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %v", path, pathProblem(err))
	}
	return nil
}

// pathProblem is err without the path an *os.PathError or *os.LinkError
// names (a temporary file's): "no such file or directory".
func pathProblem(err error) error {
	var pe *os.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return pe.Err
	case errors.As(err, &le):
		return le.Err
	}
	return err
}
