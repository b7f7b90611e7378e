package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/devchar"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
)

// cleanupCmd removes what nri-gpu leaves on the node on purpose when it
// stops: the /dev/char links it made (devCharLinks), which running
// containers need through a systemctl daemon-reload. Only the links its
// record lists, made in this boot and still as made, are removed, then the
// record; for an uninstall, once nri-gpu no longer runs.
func cleanupCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "nri-gpu's configuration file (YAML): hostRoot, devCharLinks.stateDir; default: built-in defaults")
	dryRun := fs.Bool("dry-run", false, "list what would be removed, remove nothing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*cfgPath)
	if err != nil {
		return err
	}
	o := node.DevCharOptions(cfg)
	record := filepath.Join(o.StateDir, devchar.RecordName)
	links, err := devchar.Recorded(o)
	if err == nil && !*dryRun {
		links, err = devchar.Remove(o)
	}
	verb := "removed"
	if *dryRun {
		verb = "would remove"
	}
	for _, l := range links {
		fmt.Fprintf(stdout, "%s %s -> %s\n", verb, filepath.Join(cfg.HostRoot, l.Path()), l.Target)
	}
	if err != nil {
		return fmt.Errorf("/dev/char links recorded in %s: %w", record, err)
	}
	fmt.Fprintf(stdout, "%s %d /dev/char links nri-gpu made (record %s)\n", verb, len(links), record)
	return nil
}
