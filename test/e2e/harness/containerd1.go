package harness

import (
	"errors"
	"path/filepath"
)

// configV2 renders a version 2 config for containerd 1.x: CRI is one plugin,
// io.containerd.grpc.v1.cri, with its runtimes under .containerd and its image
// settings flat in it; NRI (NRI v0.8.0 in 1.7.36) is off by default and has no
// validators.
func (c *Containerd) configV2() ([]byte, error) {
	o := c.Opts
	if o.DefaultValidator {
		return nil, errors.New("containerd " + o.Tools.ContainerdVersion + " has no NRI default validator (NRI v0.8.0; validators came with NRI v0.10)")
	}
	cri := map[string]any{
		"restrict_oom_score_adj": true, // this machine lacks CAP_SYS_RESOURCE
		"sandbox_image":          o.SandboxImage,
		"enable_cdi":             true,
		"cdi_spec_dirs":          []string{c.CDISpecDir},
		"stream_server_address":  "127.0.0.1",
		"stream_server_port":     "0",
		"cni": map[string]any{
			"bin_dir":  filepath.Join(c.Dir, "cni", "bin"),
			"conf_dir": filepath.Join(c.Dir, "cni", "conf"),
		},
		"containerd": map[string]any{
			"snapshotter":          "native",
			"default_runtime_name": "runc",
			"runtimes":             map[string]any{"runc": c.runcRuntime()},
		},
	}
	nri := c.nriConfig()
	cfg := c.document(2, map[string]any{
		"io.containerd.internal.v1.opt": map[string]any{"path": filepath.Join(c.Dir, "opt")},
		"io.containerd.grpc.v1.cri":     cri,
		"io.containerd.nri.v1.nri":      nri,
	})
	return c.render(cfg)
}
