package plugin

import (
	"strings"

	"golang.org/x/mod/semver"
)

// crioDropsCDI is CRI-O's rule for emit: cdi. CRI-O 1.34 (which embeds a
// pre-release of NRI v0.9) silently drops the CDI devices that a plugin's
// adjustment names, where containerd 2.4 injects them; the same devices in
// the CRI request's CDI_devices are applied. Seen with CRI-O 1.34.0 in the
// end-to-end suite. NRI's stub infers NRI v0.10.0 for CRI-O v1.34.x (the
// first version whose runtimes inject CDI devices), so the NRI version
// alone would send it CDI names. Releases before 1.34 are not known to do
// better; later ones are left to the NRI version check.
func crioDropsCDI(runtime, version string) (why string, drops bool) {
	if runtime != "cri-o" {
		return "", false
	}
	v := "v" + strings.TrimPrefix(version, "v")
	if semver.IsValid(v) && semver.Compare(semver.MajorMinor(v), "v1.34") > 0 {
		return "", false
	}
	return "CRI-O " + version + " drops CDI devices returned through NRI", true
}
