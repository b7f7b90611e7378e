package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/sirupsen/logrus"
)

// logFormats are the values of --log-format: logrus's text lines, or one
// JSON object per line (logrus.JSONFormatter) for log collectors.
var logFormats = []string{"text", "json"}

// logFlags are the --log-level and --log-format flags of a command that
// logs.
type logFlags struct {
	level, format *string
}

// addLogFlags adds --log-level and --log-format to fs.
func addLogFlags(fs *flag.FlagSet, level string) logFlags {
	return logFlags{
		level:  fs.String("log-level", level, "log level: "+strings.Join(levelNames(), ", ")),
		format: fs.String("log-format", "text", "log format: "+strings.Join(logFormats, " or ")+" (one JSON object per line)"),
	}
}

// logger checks the flags and returns a logger writing to w; a bad value
// is a usage error that lists the valid ones.
func (f logFlags) logger(w io.Writer) (*logrus.Logger, error) {
	lvl, err := parseLevel(*f.level)
	if err != nil {
		return nil, err
	}
	log := logrus.New()
	log.SetOutput(w)
	log.SetLevel(lvl)
	switch *f.format {
	case "text":
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return nil, usageError{fmt.Errorf("--log-format: %q is not a format (valid: %s)", *f.format, strings.Join(logFormats, ", "))}
	}
	// The NRI stub logs through logrus's standard logger ("Created
	// plugin ..."): the same format, level and output, so that a JSON log
	// has no text line.
	std := logrus.StandardLogger()
	std.SetOutput(w)
	std.SetLevel(lvl)
	std.SetFormatter(log.Formatter)
	return log, nil
}

// parseLevel parses a --log-level value; an unknown one is a usage error
// that lists the levels.
func parseLevel(s string) (logrus.Level, error) {
	lvl, err := logrus.ParseLevel(s)
	if err != nil {
		return 0, usageError{fmt.Errorf("--log-level: %q is not a level (valid: %s)", s, strings.Join(levelNames(), ", "))}
	}
	return lvl, nil
}

// levelNames are logrus's levels, most verbose first.
func levelNames() []string {
	out := make([]string, 0, len(logrus.AllLevels))
	for i := len(logrus.AllLevels) - 1; i >= 0; i-- {
		out = append(out, logrus.AllLevels[i].String())
	}
	return out
}
