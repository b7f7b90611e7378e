package plugin

import (
	"errors"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/pipeline"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Observer is told what the plugin and its node do, so that it can be
// counted (the metrics package implements it). Its methods are called on
// the request path and from the refresh loop: they must be cheap, must not
// block and must be safe for concurrent use.
type Observer interface {
	node.Observer
	// Request is called once per CreateContainer with the label of the
	// request's source (request.SourceKind.Label), its outcome
	// (OutcomeInjected, ...), the GPUs injected and the time it took.
	Request(source, outcome string, gpus []inventory.GPU, took time.Duration)
	// Connected is called each time the runtime synchronizes the plugin
	// on a new connection.
	Connected()
}

// Request outcomes, as told to an Observer.
const (
	// OutcomeInjected: the container got GPUs or the driver.
	OutcomeInjected = "injected"
	// OutcomeUntouched: no request, or a request dropped with a note.
	OutcomeUntouched = "untouched"
	// OutcomeRefused: the request was bad or could not be met; the
	// container's creation failed.
	OutcomeRefused = "refused"
)

// SetObserver makes o the observer of the plugin and of its node, and
// tells it the current inventory. Call it before Run and before watching.
func (p *Plugin) SetObserver(o Observer) {
	p.obs = o
	p.node.SetObserver(o)
}

// observer returns the plugin's observer, or one that ignores everything.
func (p *Plugin) observer() Observer {
	if p.obs == nil {
		return nopObserver{}
	}
	return p.obs
}

type nopObserver struct{}

func (nopObserver) Request(string, string, []inventory.GPU, time.Duration) {}
func (nopObserver) Refresh(string)                                         {}
func (nopObserver) Inventory(*inventory.Snapshot)                          {}
func (nopObserver) Connected()                                             {}

// observeRequest tells the observer how a CreateContainer went. A
// refused request counts under the source its error names (the variable
// that was wrong); an ignored NVIDIA_VISIBLE_DEVICES answers with an
// adjustment (the variable set to void) but injects nothing.
func (p *Plugin) observeRequest(res *pipeline.Result, adj *api.ContainerAdjustment, err error, took time.Duration) {
	src := res.Request.Source.Kind
	var rerr *request.Error
	if errors.As(err, &rerr) {
		src = rerr.Source.Kind
	}
	outcome := OutcomeUntouched
	injected := adj != nil && res.Injected()
	switch {
	case err != nil:
		outcome = OutcomeRefused
	case injected:
		outcome = OutcomeInjected
	}
	var gpus []inventory.GPU
	if injected {
		gpus = res.GPUs
	}
	p.observer().Request(src.Label(), outcome, gpus, took)
}
