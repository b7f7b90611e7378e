package inventory

import (
	"strconv"
	"strings"
)

// cudaByBranch maps a driver branch (the first number of its version) to
// the CUDA driver API version that branch's libcuda reports through
// cuDriverGetVersion, from NVIDIA's CUDA toolkit release notes (table
// "CUDA Toolkit and Corresponding Driver Versions"). A branch between two
// entries reports the older one's version.
var cudaByBranch = []struct {
	branch int
	cuda   string
}{
	{590, "13.1"},
	{580, "13.0"},
	{575, "12.9"},
	{570, "12.8"},
	{565, "12.7"},
	{560, "12.6"},
	{555, "12.5"},
	{550, "12.4"},
	{545, "12.3"},
	{535, "12.2"},
	{530, "12.1"},
	{525, "12.0"},
	{520, "11.8"},
	{515, "11.7"},
	{510, "11.6"},
	{495, "11.5"},
	{470, "11.4"},
	{465, "11.3"},
	{460, "11.2"},
	{455, "11.1"},
	{450, "11.0"},
	{440, "10.2"},
	{418, "10.1"},
	{410, "10.0"},
}

// CUDAVersion returns the CUDA driver API version ("13.0") that the
// driver of the given version offers, without loading its libcuda into
// this process: nri-gpu runs on every node and must not depend on the
// driver's user-space library working in its own process. ok is false for
// a version older than the table (or unparsable); a branch newer than the
// table gets the newest entry, a lower bound.
func CUDAVersion(driver string) (cuda string, ok bool) {
	major, _, _ := strings.Cut(driver, ".")
	branch, err := strconv.Atoi(major)
	if err != nil || len(major) > 6 {
		return "", false
	}
	for _, e := range cudaByBranch {
		if branch >= e.branch {
			return e.cuda, true
		}
	}
	return "", false
}
