package plugin

import "errors"

// NotReady returns nil when the plugin is ready (see Ready), or an error
// saying why it is not, for the /readyz endpoint.
func (p *Plugin) NotReady() error {
	if r := p.notReady(); r != "" {
		return errors.New(r)
	}
	return nil
}

// Allocations returns, per GPU of the allocation table, how many
// containers hold it: what the metrics' per-GPU allocation gauge reports.
func (p *Plugin) Allocations() []Allocation {
	var out []Allocation
	for _, g := range p.Status().GPUs {
		out = append(out, Allocation{Index: g.Index, UUID: g.UUID, Holders: len(g.Holders)})
	}
	return out
}

// Allocation is one GPU's count of holders.
type Allocation struct {
	Index   int
	UUID    string
	Holders int
}
