package plugin

import (
	"fmt"
	"strings"

	"golang.org/x/mod/semver"
)

// Runtimes known to drop CDI devices that a plugin returns in an adjustment,
// whatever NRI version they report: containerd before 2.2 (containerd 1.7 has
// NRI v0.8.0, and reports no NRI version; a runtime built against a newer NRI
// library, as a test runtime is, would otherwise pass the version check).
const firstCDIContainerd = "v2.2.0"

// runtimeInjectsCDI says whether the runtime that connected (the name and
// version it sent in Configure, and its NRI version, reported or inferred by
// the stub) injects CDI devices named in an adjustment; when it does not, the
// reason names what decided.
func runtimeInjectsCDI(runtime, version, nriVersion string) (bool, string) {
	v := version
	if v != "" && !strings.HasPrefix(v, "v") {
		v = "v" + v
	}
	if runtime == "containerd" && semver.IsValid(v) && semver.Compare(v, firstCDIContainerd) < 0 {
		return false, fmt.Sprintf("containerd %s drops CDI devices returned through NRI (containerd %s and later inject them)", version, strings.TrimPrefix(firstCDIContainerd, "v"))
	}
	if !semver.IsValid(nriVersion) || semver.Compare(nriVersion, minCDINRIVersion) < 0 {
		return false, fmt.Sprintf("%s %s has NRI %s, which drops CDI devices returned through NRI (NRI %s and later inject them)", runtime, version, nriVersion, minCDINRIVersion)
	}
	return true, ""
}
