package plugin

import "errors"

// NotReady returns nil when the plugin is ready (see Ready), or an error
// saying why it is not, for the /readyz endpoint.
func (p *Plugin) NotReady() error {
	switch {
	case p.state.Load() == nil:
		return errors.New("no inventory loaded")
	case !p.synced.Load():
		return errors.New("not connected to the runtime, or not synchronized yet")
	}
	return nil
}
