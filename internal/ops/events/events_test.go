package events

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
)

// apiServer is the events endpoint of an API server: it stores what
// client-go's recorder creates and counts its patches (repeats).
type apiServer struct {
	mu      sync.Mutex
	created []corev1.Event
	patches []map[string]any
	paths   []string
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paths = append(s.paths, r.Method+" "+r.URL.Path)
	switch r.Method {
	case http.MethodPost:
		var e corev1.Event
		if err := json.Unmarshal(body, &e); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		e.ResourceVersion = "1"
		s.created = append(s.created, e)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(e)
	case http.MethodPatch:
		var p map[string]any
		json.Unmarshal(body, &p)
		s.patches = append(s.patches, p)
		e := s.created[len(s.created)-1]
		if c, ok := p["count"].(float64); ok {
			e.Count = int32(c)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(e)
	default:
		http.Error(w, "unexpected", http.StatusMethodNotAllowed)
	}
}

func (s *apiServer) seen() (created []corev1.Event, patches []map[string]any, paths []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]corev1.Event(nil), s.created...), append([]map[string]any(nil), s.patches...), append([]string(nil), s.paths...)
}

func quiet() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

// TestRecorderWritesEvents: an Event reaches the API server through
// client-go's recorder as a Warning on the pod, with nri-gpu as its source
// and the container and carrier as annotations; the same refusal again
// (the kubelet retries a refused container) patches the Event's count
// instead of making another.
func TestRecorderWritesEvents(t *testing.T) {
	srv := &apiServer{}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := New(ctx, &rest.Config{Host: ts.URL}, "gpu-node-1", quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	e := Event{Namespace: "ml", Pod: "train", UID: "uid-1", Container: "main", Reason: ReasonRefused,
		Message: `nri-gpu: annotation gpus.nri-gpu.dev/pod: count 9 exceeds the node's 4 GPUs (0-3)`, Source: "annotation gpus.nri-gpu.dev/pod"}
	r.Report(e)
	r.Report(e)
	deadline := time.Now().Add(10 * time.Second)
	for {
		created, patches, paths := srv.seen()
		if len(created) == 1 && len(patches) == 1 {
			got := created[0]
			if got.Namespace != "ml" || got.InvolvedObject.Kind != "Pod" || got.InvolvedObject.Name != "train" || got.InvolvedObject.UID != "uid-1" ||
				got.Type != corev1.EventTypeWarning || got.Reason != ReasonRefused || got.Message != e.Message ||
				got.Source.Component != Component || got.Source.Host != "gpu-node-1" || got.ReportingController != Component ||
				got.Annotations[AnnotationContainer] != "main" || got.Annotations[AnnotationSource] != e.Source {
				t.Errorf("created %+v", got)
			}
			if c, _ := patches[0]["count"].(float64); c != 2 {
				t.Errorf("the repeat patched %v, want count 2", patches[0])
			}
			if paths[0] != "POST /api/v1/namespaces/ml/events" {
				t.Errorf("requests %v", paths)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the API server has %d Events and %d patches: %v", len(created), len(patches), paths)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReportDoesNotWaitForAPIServer: with an API server that takes
// connections and never answers, Report still returns at once, for more
// Events than the recorder queues (they are dropped).
func TestReportDoesNotWaitForAPIServer(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer ts.Close()
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := New(ctx, &rest.Config{Host: ts.URL}, "node", quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 3000 {
			r.Report(Event{Namespace: "ns", Pod: "p" + strings.Repeat("x", i%7), UID: "u", Container: "c", Reason: ReasonVoided, Message: "m"})
		}
	}()
	// Not a speed check (BenchmarkCreateContainerEvents measures the
	// cost): a Report that waited for this server would never return.
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Report blocked with the API server not answering")
	}
}

// TestReportRateLimit: a flood of refusals on many pods reaches the API
// server as the node's burst (eventBurst) and its rate, not as many
// Events as refusals; the rest are dropped and counted.
func TestReportRateLimit(t *testing.T) {
	srv := &apiServer{}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := New(ctx, &rest.Config{Host: ts.URL}, "node", quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	start := time.Now()
	const n = 2000
	for i := range n {
		r.Report(Event{Namespace: "ns", Pod: fmt.Sprintf("p%d", i), UID: "u", Container: "c", Reason: ReasonRefused, Message: "m"})
	}
	// At most the burst and what the rate refilled while reporting.
	most := eventBurst + int(time.Since(start).Seconds()*eventQPS) + 1
	accepted := n - int(r.dropped.Load())
	if accepted < eventBurst || accepted > most {
		t.Errorf("%d of %d Events accepted, want the burst (%d) and at most %d (the rate)", accepted, n, eventBurst, most)
	}
	// Each accepted Event (one per pod: no folding) reaches the server.
	deadline := time.Now().Add(30 * time.Second)
	for {
		created, _, _ := srv.seen()
		if len(created) == accepted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Events written, %d accepted", len(created), accepted)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTruncate(t *testing.T) {
	long := strings.Repeat("é", 600) // 1200 bytes
	got := truncate(long, maxMessage)
	if len(got) > maxMessage || !strings.HasSuffix(got, "...") || !strings.HasPrefix(long, strings.TrimSuffix(got, "...")) {
		t.Errorf("truncate: %d bytes, %q...", len(got), got[:10])
	}
	if truncate("short", maxMessage) != "short" {
		t.Error("a short message changed")
	}
}
