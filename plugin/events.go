package plugin

import (
	"errors"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/ops/events"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/pipeline"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
)

// EventSink hears of the containers whose request nri-gpu refused or
// voided (package events makes them Kubernetes Events on the pod). Report
// is called on the request path once the answer is decided: it must not
// block, and must be safe for concurrent use.
type EventSink interface {
	Report(events.Event)
}

// SetEventSink makes s hear of refused and voided requests. Call it
// before Run.
func (p *Plugin) SetEventSink(s EventSink) { p.events = s }

// report tells the event sink, if any, of the pod's refused or voided
// container.
func (p *Plugin) report(pod *api.PodSandbox, ctr *api.Container, res *pipeline.Result, err error) {
	if p.events == nil {
		return
	}
	if e, ok := podEvent(pod, ctr, res, err); ok {
		p.events.Report(e)
	}
}

// podEvent is the Event a pod gets for its container's answer: the
// refusal (err, with the message the runtime shows, which names no other
// tenant's pod), or the void of an NVIDIA_VISIBLE_DEVICES the policy
// refused. ok is false for any other answer, and for a sandbox without a
// pod name (not a Kubernetes pod: crictl).
func podEvent(pod *api.PodSandbox, ctr *api.Container, res *pipeline.Result, err error) (e events.Event, ok bool) {
	if pod.GetName() == "" {
		return events.Event{}, false
	}
	e = events.Event{Namespace: pod.GetNamespace(), Pod: pod.GetName(), UID: pod.GetUid(), Container: ctr.GetName(), Source: res.Request.Source.String()}
	switch {
	case err != nil:
		e.Reason = events.ReasonRefused
		e.Message = "container " + ctr.GetName() + ": " + strings.TrimPrefix(err.Error(), "nri-gpu: ") + "; not created"
		var rerr *request.Error
		var aerr *alloc.Error
		switch {
		case errors.As(err, &rerr):
			e.Source = rerr.Source.String()
		case errors.As(err, &aerr):
			e.Source = aerr.Source
		}
	case res.Voided:
		e.Reason = events.ReasonVoided
		e.Message = "container " + ctr.GetName() + ": " + res.Selection.Note + ": it runs without GPUs"
	default:
		return events.Event{}, false
	}
	return e, true
}
