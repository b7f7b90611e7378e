package main

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestLogFormatStandardLogger: the libraries that log through logrus's
// standard logger (the NRI stub's "Created plugin ...") write in
// --log-format too, so that a JSON log has no text line.
func TestLogFormatStandardLogger(t *testing.T) {
	std := logrus.StandardLogger()
	t.Cleanup(func() {
		std.SetOutput(os.Stderr)
		std.SetLevel(logrus.InfoLevel)
		std.SetFormatter(&logrus.TextFormatter{})
	})
	var out bytes.Buffer
	if _, err := (logFlags{level: ptr("warn"), format: ptr("json")}).logger(&out); err != nil {
		t.Fatal(err)
	}
	logrus.Info("below the level")
	logrus.WithField("plugin", "nri-gpu").Warn("Created plugin")
	var line map[string]any
	if err := json.Unmarshal(out.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %v: %q", err, out.String())
	}
	if line["msg"] != "Created plugin" || line["plugin"] != "nri-gpu" || line["level"] != "warning" {
		t.Errorf("line %v", line)
	}
}
