// Package events writes Kubernetes Events on the pods whose containers'
// GPU requests nri-gpu refused or voided, so that `kubectl describe pod`
// says why a container was not created, or runs without GPUs.
//
// It is client-go's event recorder (tools/record), as the kubelet uses
// it. Report takes a token of the node's rate limit (50 Events a second,
// a burst of 100: the kubelet's defaults for its own), puts the Event on
// a queue and returns at once; a goroutine hands it to the recorder,
// whose own goroutine writes to the API server, folding repeats into one
// Event with a count (the kubelet retries a refused container),
// rate-limiting per pod (a burst of 25, then one Event every 5 minutes)
// and retrying a failed write a few times. When the API server is slow or
// away the recorder's queue fills (1000 Events) and further Events are
// dropped: the request path never waits for the API server.
package events

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	"github.com/nri-gpu/nri-gpu/internal/ops/kubeapi"
)

// Reasons of nri-gpu's Events (their type is Warning).
const (
	// ReasonRefused: the container's request was refused; the runtime
	// does not create it (the kubelet shows CreateContainerError).
	ReasonRefused = "GPURequestRefused"
	// ReasonVoided: the policy refused the container's
	// NVIDIA_VISIBLE_DEVICES; it runs without GPUs, the variable set to
	// void.
	ReasonVoided = "GPURequestVoided"
)

// Annotations of nri-gpu's Events, for tools that read them.
const (
	// AnnotationContainer names the container of the pod.
	AnnotationContainer = "nri-gpu.dev/container"
	// AnnotationSource names the request's carrier: the annotation key
	// or environment variable ("annotation gpus.nri-gpu.dev/pod").
	AnnotationSource = "nri-gpu.dev/source"
)

// Component is the Events' source component (kubectl describe's From).
const Component = "nri-gpu"

// maxMessage is the longest message written, in bytes: the
// events.k8s.io API's limit on a note.
const maxMessage = 1024

// writeTimeout bounds one write to the API server, so that a server that
// accepts the connection and never answers holds the writer (not the
// request path) only that long per try.
const writeTimeout = 10 * time.Second

// Event is what nri-gpu tells a pod about one of its containers.
type Event struct {
	// Namespace, Pod and UID name the pod (NRI's PodSandbox).
	Namespace, Pod, UID string
	// Container is the container's name.
	Container string
	// Reason is ReasonRefused or ReasonVoided.
	Reason string
	// Message says what was refused and why: the carrier, the bad
	// token, what is valid, the policy key that decided.
	Message string
	// Source is the request's carrier, as request.Source names it.
	Source string
}

// Recorder writes Events to the API server. Its Report is safe for
// concurrent use and never blocks.
type Recorder struct {
	// queue hands Events from the request path to the goroutine that
	// gives them to client-go's recorder (whose own queue, when full,
	// logs each Event it drops: work kept off the request path too).
	queue chan Event
	// limit bounds the Events of the whole node (client-go's recorder
	// bounds each pod's), so that a flood of refusals costs the node and
	// the API server little; what it refuses is dropped.
	limit    flowcontrol.RateLimiter
	dropped  atomic.Uint64
	recorder record.EventRecorderLogger
	stop     context.CancelFunc
	done     chan struct{}
	log      *logrus.Entry
}

// queueLen is how many Events wait for the recorder's goroutine at most;
// it takes each at once, so the queue fills only when that goroutine
// gets no CPU.
const queueLen = 256

// The node's Events a second, and the burst: the kubelet's defaults for
// its own (eventRecordQPS, eventBurst).
const (
	eventQPS   = 50
	eventBurst = 100
)

// dropLogInterval is how often the count of dropped Events is logged at
// most.
const dropLogInterval = time.Minute

// New returns a Recorder that writes through cfg (kubeapi.Config) as the
// nri-gpu of node host, until ctx ends or Stop is called; the client
// libraries' logs go to log.
func New(ctx context.Context, cfg *rest.Config, host string, log *logrus.Entry) (*Recorder, error) {
	c := rest.CopyConfig(cfg)
	c.Timeout = writeTimeout
	// The client's own limit (5 a second by default) would hold Events
	// the node's limit let through.
	c.QPS, c.Burst = eventQPS, eventBurst
	if c.UserAgent == "" {
		c.UserAgent = kubeapi.UserAgent
	}
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("events: API server client: %w", err)
	}
	core, err := typedcorev1.NewForConfigAndClient(c, hc)
	if err != nil {
		return nil, fmt.Errorf("events: API server client: %w", err)
	}
	return NewWithSink(ctx, &typedcorev1.EventSinkImpl{Interface: core.Events("")}, host, log), nil
}

// NewWithSink is New writing to sink, which client-go's recorder calls
// from its own goroutine.
func NewWithSink(ctx context.Context, sink record.EventSink, host string, log *logrus.Entry) *Recorder {
	log = log.WithField("component", "events")
	logger := kubeapi.Logger(log)
	ctx, stop := context.WithCancel(ctx)
	b := record.NewBroadcaster(record.WithContext(klog.NewContext(ctx, logger)))
	b.StartRecordingToSink(sink)
	r := &Recorder{
		queue:    make(chan Event, queueLen),
		limit:    flowcontrol.NewTokenBucketRateLimiter(eventQPS, eventBurst),
		recorder: b.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: Component, Host: host}).WithLogger(logger),
		stop:     stop,
		done:     make(chan struct{}),
		log:      log,
	}
	go r.run(ctx, b)
	return r
}

// Report queues e for the API server and returns at once. Beyond the
// node's rate (eventQPS), or when the queue is full, e is dropped:
// counted, and the count logged by the writer.
func (r *Recorder) Report(e Event) {
	if !r.limit.TryAccept() {
		r.dropped.Add(1)
		return
	}
	select {
	case r.queue <- e:
	default:
		r.dropped.Add(1)
	}
}

// Stop stops writing and waits for the writer to end; Events still
// queued are dropped.
func (r *Recorder) Stop() {
	r.stop()
	<-r.done
}

// run gives the queued Events to client-go's recorder until ctx ends,
// then shuts the broadcaster down.
func (r *Recorder) run(ctx context.Context, b record.EventBroadcaster) {
	defer close(r.done)
	defer b.Shutdown()
	tick := time.NewTicker(dropLogInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-r.queue:
			r.record(e)
		case <-tick.C:
			if n := r.dropped.Swap(0); n > 0 {
				r.log.Warnf("%d Events dropped in the last %s: more refusals than %d a second (or than the writer could queue); they are in nri-gpu's log", n, dropLogInterval, eventQPS)
			}
		}
	}
}

// record hands e to client-go's recorder, as a Warning on the pod.
func (r *Recorder) record(e Event) {
	pod := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: e.Namespace, Name: e.Pod, UID: types.UID(e.UID)}
	ann := map[string]string{AnnotationContainer: e.Container}
	if e.Source != "" {
		ann[AnnotationSource] = e.Source
	}
	r.recorder.AnnotatedEventf(pod, ann, corev1.EventTypeWarning, e.Reason, "%s", truncate(e.Message, maxMessage))
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	s = s[:n-len(mark)]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + mark
}
