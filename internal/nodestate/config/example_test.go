package config_test

import (
	"fmt"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
)

// Keys are checked at every depth, case included, and each mode key is a
// typed value.
func ExampleParse() {
	c, err := config.Parse([]byte("libraryMode: files\nsharing: exclusive\n"))
	fmt.Println(c.LibraryMode == config.LibraryFiles, c.Sharing, err)

	_, err = config.Parse([]byte("cdiImport:\n  kind: amd.com/gpu\n  SPECDIRS: [/etc/cdi]\n"))
	fmt.Println(err)
	// Output:
	// true exclusive <nil>
	// key cdiImport: unknown field "SPECDIRS": keys are case-sensitive, did you mean "specDirs"? (valid keys: kind, specDirs, allowHooks, allowWritableMounts)
}
