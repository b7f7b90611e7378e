package config

// Events configures the Kubernetes Events nri-gpu writes on a pod whose
// container's GPU request it refused, or whose NVIDIA_VISIBLE_DEVICES the
// policy voided (docs/operations.md).
type Events struct {
	// Enabled writes them when nri-gpu can reach the API server
	// (dra.kubeconfig, else the pod's service account); default true.
	// Read at start.
	Enabled *bool `json:"enabled,omitempty"`
}

// On reports whether Events are written (where an API server client can
// be made).
func (e Events) On() bool { return e.Enabled == nil || *e.Enabled }

// Explicit reports whether the configuration names the key (enabled:
// true or false), rather than leaving the default.
func (e Events) Explicit() bool { return e.Enabled != nil }
