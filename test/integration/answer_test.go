package integration

import (
	"regexp"
	"strings"

	"github.com/containerd/nri/pkg/api"
)

// answer is an adjustment as the tests compare it, whole: the device nodes
// it adds (their paths), its mounts (their destinations), its environment,
// annotations and CDI devices, and Other, the rest of the message in text
// form less its empty messages (NRI's runtime side fills some in), which
// nri-gpu leaves empty ("" when it does). nil for no adjustment.
type answer struct {
	Devices     []string
	Mounts      []string
	Env         map[string]string
	Annotations map[string]string
	CDIDevices  []string
	Other       string
}

// answerOf returns the answer adj gives; it changes adj and restores it
// while it reads the rest of the message.
func answerOf(adj *api.ContainerAdjustment) *answer {
	if adj == nil {
		return nil
	}
	a := &answer{}
	for _, d := range adj.GetLinux().GetDevices() {
		a.Devices = append(a.Devices, d.GetPath())
	}
	for _, m := range adj.GetMounts() {
		a.Mounts = append(a.Mounts, m.GetDestination())
	}
	for _, e := range adj.GetEnv() {
		if a.Env == nil {
			a.Env = map[string]string{}
		}
		a.Env[e.GetKey()] = e.GetValue()
	}
	a.Annotations = adj.GetAnnotations()
	for _, d := range adj.GetCDIDevices() {
		a.CDIDevices = append(a.CDIDevices, d.GetName())
	}
	linux, mounts, env, ann, cdi := adj.Linux, adj.Mounts, adj.Env, adj.Annotations, adj.CDIDevices
	adj.Mounts, adj.Env, adj.Annotations, adj.CDIDevices = nil, nil, nil, nil
	if linux != nil && len(linux.GetDevices()) > 0 {
		devs := linux.Devices
		linux.Devices = nil
		if linux.String() == "" {
			adj.Linux = nil
		}
		a.Other = adj.String()
		linux.Devices = devs
	} else {
		a.Other = adj.String()
	}
	adj.Linux, adj.Mounts, adj.Env, adj.Annotations, adj.CDIDevices = linux, mounts, env, ann, cdi
	for prev := ""; prev != a.Other; {
		prev, a.Other = a.Other, strings.TrimSpace(emptyMessage.ReplaceAllString(a.Other, ""))
	}
	return a
}

// emptyMessage is an empty message field in text form: "memory:{}".
var emptyMessage = regexp.MustCompile(`\w+:\s*\{\s*\}`)
