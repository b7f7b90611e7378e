package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// AuditEvent is what a test reads of one API server audit event (the
// audit.k8s.io/v1 Event, ClusterOptions.AuditPolicy's log).
type AuditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Received time.Time `json:"requestReceivedTimestamp"`
	// StageAt is when the event's stage was reached: for a request's
	// ResponseComplete, Stage minus Received is its latency.
	StageAt time.Time `json:"stageTimestamp"`
}

// Resource is the event's resource, with its subresource after a '/'
// ("resourceslices", "pods/status"), or its URI's path for a request of
// none ("/api").
func (e AuditEvent) Resource() string {
	if e.ObjectRef == nil || e.ObjectRef.Resource == "" {
		p, _, _ := strings.Cut(e.RequestURI, "?")
		return p
	}
	if e.ObjectRef.Subresource != "" {
		return e.ObjectRef.Resource + "/" + e.ObjectRef.Subresource
	}
	return e.ObjectRef.Resource
}

// Request reports whether the event stands for one request: a watch
// when it starts (its ResponseStarted), anything else when it completes.
func (e AuditEvent) Request() bool {
	if e.Verb == "watch" {
		return e.Stage == "ResponseStarted"
	}
	return e.Stage == "ResponseComplete" || e.Stage == "Panic"
}

// ReadAudit reads the audit log at path: the events of user ("" for all).
func ReadAudit(path, user string) ([]AuditEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if user == "" || e.User.Username == user {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}
