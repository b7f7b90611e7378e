package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
)

// configCmd is nri-gpu config validate FILE: the configuration parsed
// strictly and validated as nri-gpu run reads it, without discovery; an
// error names the key and, where the file has it, its line.
func configCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "validate" {
		return usageError{errors.New("usage: nri-gpu config validate FILE")}
	}
	fs := flag.NewFlagSet("config validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() != 1 {
		return usageError{errors.New("usage: nri-gpu config validate FILE")}
	}
	path := fs.Arg(0)
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if _, err := config.Parse(data); err != nil {
		return fmt.Errorf("%s%s: %w", path, config.Line(data, err), err)
	}
	fmt.Fprintf(stdout, "%s: valid\n", path)
	return nil
}
