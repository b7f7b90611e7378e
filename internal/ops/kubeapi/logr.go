package kubeapi

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
)

// logSink sends a Kubernetes library's logs (logr, through klog's
// context) to nri-gpu's logger: its errors as errors, its verbosity-0
// messages as information, and the verbose ones (each gRPC call and
// answer of the DRA helper library, say) at debug level only.
type logSink struct {
	log  *logrus.Entry
	name string
	kv   []any
}

// Logger returns a logr.Logger that writes to log, for the Kubernetes
// libraries (klog.NewContext).
func Logger(log *logrus.Entry) logr.Logger { return logr.New(&logSink{log: log}) }

func (s *logSink) Init(logr.RuntimeInfo) {}

func (s *logSink) Enabled(level int) bool {
	return level <= 0 || s.log.Logger.IsLevelEnabled(logrus.DebugLevel)
}

func (s *logSink) entry(kv []any) *logrus.Entry {
	e := s.log
	if s.name != "" {
		e = e.WithField("logger", s.name)
	}
	all := append(append([]any(nil), s.kv...), kv...)
	for i := 0; i+1 < len(all); i += 2 {
		e = e.WithField(fmt.Sprint(all[i]), all[i+1])
	}
	return e
}

func (s *logSink) Info(level int, msg string, kv ...any) {
	if level <= 0 {
		s.entry(kv).Info(msg)
		return
	}
	s.entry(kv).Debug(msg)
}

func (s *logSink) Error(err error, msg string, kv ...any) { s.entry(kv).WithError(err).Error(msg) }

func (s *logSink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.kv = append(append([]any(nil), s.kv...), kv...)
	return &c
}

func (s *logSink) WithName(name string) logr.LogSink {
	c := *s
	if c.name != "" {
		name = c.name + "/" + name
	}
	c.name = name
	return &c
}
