package plugin

import (
	"errors"
	"strings"
	"time"

	"github.com/nri-gpu/nri-gpu/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/request"
)

// Observer is told what the plugin does, so that it can be counted (the
// metrics package implements it). Its methods are called on the request
// path and from the refresh loop: they must be cheap, must not block and
// must be safe for concurrent use.
type Observer interface {
	// Request is called once per CreateContainer with the request's
	// source (SourceContainerAnnotation, ...), its outcome
	// (OutcomeInjected, ...), the GPUs injected and the time it took.
	Request(source, outcome string, gpus []inventory.GPU, took time.Duration)
	// Refresh is called once per rediscovery of the node with its result
	// (RefreshChanged, ...).
	Refresh(result string)
	// Inventory is called each time a snapshot becomes current.
	Inventory(snap *inventory.Snapshot)
	// Connected is called each time the runtime synchronizes the plugin
	// on a new connection.
	Connected()
}

// Request sources, as told to an Observer. The container's name is not
// part of them, so that they stay few.
const (
	SourceContainerAnnotation = "container-annotation"
	SourcePodAnnotation       = "pod-annotation"
	SourceCDIAnnotation       = "cdi-annotation"
	SourceDeviceList          = "device-list"
	SourceEnv                 = "env"
	SourceNone                = "none"
)

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

// Refresh results, as told to an Observer.
const (
	// RefreshChanged: the node changed and the new snapshot is current.
	RefreshChanged = "changed"
	// RefreshUnchanged: the node is as it was; nothing was swapped.
	RefreshUnchanged = "unchanged"
	// RefreshRejected: discovery found a broken driver; the last good
	// snapshot stays.
	RefreshRejected = "rejected"
	// RefreshError: discovery failed; the last good snapshot stays.
	RefreshError = "error"
)

// SetObserver makes o the plugin's observer and tells it the current
// inventory. Call it before Run and Watch.
func (p *Plugin) SetObserver(o Observer) {
	p.obs = o
	if st := p.state.Load(); st != nil {
		o.Inventory(st.snap)
	}
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

// observeRequest tells the observer how a CreateContainer went.
func (p *Plugin) observeRequest(res Result, adj bool, err error, took time.Duration) {
	src := res.Request.Source
	var rerr *request.Error
	var aerr *alloc.Error
	switch {
	case errors.As(err, &rerr):
		src = rerr.Source
	case errors.As(err, &aerr):
		src = aerr.Source
	}
	outcome := OutcomeUntouched
	switch {
	case err != nil:
		outcome = OutcomeRefused
	case adj:
		outcome = OutcomeInjected
	}
	var gpus []inventory.GPU
	if adj {
		gpus = res.GPUs
	}
	p.observer().Request(sourceLabel(src), outcome, gpus, took)
}

// sourceLabel maps a request's source ("annotation
// gpus.nri-gpu.dev/container.train") to one of the Source constants.
func sourceLabel(src string) string {
	switch {
	case strings.HasPrefix(src, "annotation "+request.AnnotationCDIContainerPrefix), src == "annotation "+request.AnnotationCDIPod:
		return SourceCDIAnnotation
	case strings.HasPrefix(src, "mounts "):
		return SourceDeviceList
	case strings.HasPrefix(src, "annotation "+request.AnnotationContainerPrefix):
		return SourceContainerAnnotation
	case strings.HasPrefix(src, "annotation "):
		return SourcePodAnnotation
	case strings.HasPrefix(src, "env "):
		return SourceEnv
	}
	return SourceNone
}
