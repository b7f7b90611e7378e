package kubeapi

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestConfig: a kubeconfig file gives its server and nri-gpu's user
// agent; without one, outside a pod, the error names the key.
func TestConfig(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600)
	cfg, err := Config(kc)
	if err != nil || cfg.Host != "https://10.0.0.1:6443" || cfg.UserAgent != UserAgent {
		t.Errorf("Config(%s) = %+v, %v", kc, cfg, err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := Config(""); err == nil || !strings.Contains(err.Error(), "dra.kubeconfig") {
		t.Errorf("in-cluster outside a pod: %v", err)
	}
}

// TestLogger: a library's error is logged as an error with its key-value
// pairs; its verbose messages only at debug level.
func TestLogger(t *testing.T) {
	var out bytes.Buffer
	l := logrus.New()
	l.SetOutput(&out)
	log := Logger(logrus.NewEntry(l)).WithName("record").WithValues("event", "e1")
	log.Error(errors.New("refused"), "Server rejected event")
	log.V(4).Info("chatty")
	if s := out.String(); !strings.Contains(s, "level=error") || !strings.Contains(s, "Server rejected event") ||
		!strings.Contains(s, "event=e1") || !strings.Contains(s, "logger=record") || strings.Contains(s, "chatty") {
		t.Errorf("log:\n%s", s)
	}
}
