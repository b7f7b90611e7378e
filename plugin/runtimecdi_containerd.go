package plugin

import (
	"fmt"
	"strings"

	"golang.org/x/mod/semver"
)

// firstCDIContainerd is the first containerd that injects CDI devices a
// plugin returns in an adjustment. containerd 1.7 has NRI v0.8.0 and reports
// no NRI version; a runtime built against a newer NRI library, as a test
// runtime is, would otherwise pass the version check.
const firstCDIContainerd = "v2.2.0"

// containerdDropsCDI is containerd's rule for emit: cdi: containerd before
// 2.2 drops CDI devices returned through NRI.
func containerdDropsCDI(runtime, version string) (why string, drops bool) {
	if runtime != "containerd" {
		return "", false
	}
	v := version
	if v != "" && !strings.HasPrefix(v, "v") {
		v = "v" + v
	}
	if semver.IsValid(v) && semver.Compare(v, firstCDIContainerd) < 0 {
		return fmt.Sprintf("containerd %s drops CDI devices returned through NRI (containerd %s and later inject them)", version, strings.TrimPrefix(firstCDIContainerd, "v")), true
	}
	return "", false
}
