package pipeline

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// The toolkit's variables that ask for MIG management: reconfiguring MIG
// (nvidia-smi mig -cgi/-dgi) and monitoring every MIG device.
const (
	EnvMIGConfigDevices  = "NVIDIA_MIG_CONFIG_DEVICES"
	EnvMIGMonitorDevices = "NVIDIA_MIG_MONITOR_DEVICES"
)

// migManagement returns the MIG management capability nodes a container
// asks for with NVIDIA_MIG_CONFIG_DEVICES=all (mig/config) and
// NVIDIA_MIG_MONITOR_DEVICES=all (mig/monitor), where its namespace may
// make management requests (policy: as management.nvidia.com/gpu). A value
// other than "all", a namespace without the right, or a node without the
// capability is an error naming the variable: the container asked for
// more than it can get.
func (p *Path) migManagement(c *call) ([]inventory.DeviceNode, error) {
	var cfg, mon string
	var haveCfg, haveMon bool
	for _, kv := range c.ctr.GetEnv() {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case EnvMIGConfigDevices:
			cfg, haveCfg = strings.TrimSpace(v), true
		case EnvMIGMonitorDevices:
			mon, haveMon = strings.TrimSpace(v), true
		}
	}
	mc := p.Source.Snapshot().MIGControl
	var out []inventory.DeviceNode
	for _, v := range []struct {
		key  string
		val  string
		have bool
		node *inventory.DeviceNode
		what string
	}{
		{EnvMIGConfigDevices, cfg, haveCfg, mc.Config, "mig/config"},
		{EnvMIGMonitorDevices, mon, haveMon, mc.Monitor, "mig/monitor"},
	} {
		if !v.have || v.val == "" {
			continue
		}
		src := request.Source{Kind: request.Env, Key: v.key}
		if v.val != "all" {
			return nil, &request.Error{Source: src, Msg: fmt.Sprintf("unsupported value %s (valid: all)", quoteToken(v.val))}
		}
		if ns := c.pod.GetNamespace(); !p.Policy.Allows(policy.Management, ns) {
			return nil, &request.Error{Source: src, Msg: fmt.Sprintf("MIG management not allowed in namespace %q (%s)", ns, p.Policy.Setting(policy.Management))}
		}
		if v.node == nil {
			return nil, &request.Error{Source: src, Msg: "the node has no MIG " + v.what + " capability (no MIG, or no NVML: see nri-gpu inventory)"}
		}
		out = append(out, *v.node)
	}
	return out, nil
}

// quoteToken quotes a user's token for a message, cut to 64 bytes.
func quoteToken(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// migManagementNodes says which MIG management capability nodes devs holds
// ("mig/config, mig/monitor"), for emit: cdi: no CDI device of a MIG
// device or GPU carries them, so such a container gets edits.
func migManagementNodes(mc inventory.MIGControl, devs []inventory.DeviceNode) string {
	var what []string
	for _, v := range []struct {
		node *inventory.DeviceNode
		name string
	}{{mc.Config, "mig/config"}, {mc.Monitor, "mig/monitor"}} {
		if v.node != nil && slices.ContainsFunc(devs, func(d inventory.DeviceNode) bool { return d.Major == v.node.Major && d.Minor == v.node.Minor }) {
			what = append(what, v.name)
		}
	}
	if len(what) == 0 {
		return ""
	}
	return "MIG management capabilities " + strings.Join(what, ", ") + ": no CDI device carries them"
}
