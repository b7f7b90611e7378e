package status

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
)

type fixed Status

func (f *fixed) Status() Status { return Status(*f) }

// TestHandler checks the API's two endpoints against a reporter. The
// socket itself, and the plugin's report, are tested with the plugin.
func TestHandler(t *testing.T) {
	r := &fixed{Reason: "not connected", GPUs: []GPUStatus{{GPUState: alloc.GPUState{Index: 0, Mode: "free"}, UUID: "GPU-0"}}}
	srv := httptest.NewServer(Handler(r))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/ready"); code != http.StatusServiceUnavailable || body != "not ready: not connected\n" {
		t.Errorf("/ready when not ready: %d %q", code, body)
	}
	r.Ready, r.Reason = true, ""
	if code, body := get("/ready"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("/ready when ready: %d %q", code, body)
	}
	resp, err := http.Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s Status
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil || !s.Ready || len(s.GPUs) != 1 || s.GPUs[0].UUID != "GPU-0" {
		t.Errorf("/status = %+v, %v", s, err)
	}
	if resp, err := http.Post(srv.URL+"/status", "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /status: %v, %v", resp, err)
	}
}
