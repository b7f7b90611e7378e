package plugin

import (
	"fmt"

	"golang.org/x/mod/semver"
)

// runtimeCDIRules say, by the runtime's name and version from NRI's
// Configure, when a runtime does not inject CDI devices named in an NRI
// adjustment whatever NRI version it reports or the stub infers (see
// minCDINRIVersion); then emit: cdi falls back to edits, with one warning
// per connection. One function per runtime, each in its own file.
var runtimeCDIRules = []func(runtime, version string) (why string, drops bool){
	containerdDropsCDI,
	crioDropsCDI,
}

// runtimeInjectsCDI says whether the runtime that connected (the name and
// version it sent in Configure, and its NRI version, reported or inferred by
// the stub) injects CDI devices named in an adjustment; when it does not, the
// reason names what decided: the first rule of runtimeCDIRules that applies,
// else the NRI version.
func runtimeInjectsCDI(runtime, version, nriVersion string) (bool, string) {
	for _, rule := range runtimeCDIRules {
		if why, drops := rule(runtime, version); drops {
			return false, why
		}
	}
	if !semver.IsValid(nriVersion) || semver.Compare(nriVersion, minCDINRIVersion) < 0 {
		return false, fmt.Sprintf("%s %s has NRI %s, which drops CDI devices returned through NRI (NRI %s and later inject them)", runtime, version, nriVersion, minCDINRIVersion)
	}
	return true, ""
}
