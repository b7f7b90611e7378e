// Package request turns what a container asks for (pod annotations, or the
// NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES environment) into a
// Request, and a Request into a Selection of devices and capabilities from
// the node's device source (adjust.Source). Where a request came from is a
// Source, which messages, the policy and metrics read. Everything here is
// a pure function: nothing touches the file system.
package request

import (
	"encoding/csv"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Annotation keys and environment variables that carry requests.
const (
	AnnotationDomain          = "gpus.nri-gpu.dev"
	AnnotationPrefix          = AnnotationDomain + "/"
	AnnotationContainerPrefix = AnnotationPrefix + "container."
	AnnotationPod             = AnnotationPrefix + "pod"
	EnvVisibleDevices         = "NVIDIA_VISIBLE_DEVICES"
	EnvDriverCapabilities     = "NVIDIA_DRIVER_CAPABILITIES"
)

// Kind says what a request asks for.
type Kind uint8

// Kinds of requests.
const (
	// Nothing: the container is left untouched.
	Nothing Kind = iota
	// All GPUs of the node.
	All
	// Count asks for a number of GPUs.
	Count
	// Devices asks for GPUs by ID.
	Devices
	// DriverOnly asks for the driver's files and control nodes but no
	// GPU (NVIDIA_VISIBLE_DEVICES=none).
	DriverOnly
)

// Request is a parsed GPU request, not yet checked against a node.
type Request struct {
	Kind Kind
	// Source is where the request came from.
	Source Source
	// Management is set for management.nvidia.com/gpu=all: every GPU and
	// every control node, without a workload's NVIDIA_VISIBLE_DEVICES.
	Management bool
	Count      int
	// IDs are the device IDs as the user wrote them (trimmed).
	IDs  []string
	Caps inventory.Capabilities
	// CapsSource is where Caps came from; zero for the default.
	CapsSource Source
	// Exclusive is the annotation's exclusive= field: nil when absent
	// (the node's sharing policy applies).
	Exclusive *bool
}

// Error is a request that cannot be parsed or met. Its message names the
// source, the bad token and what would have been valid.
type Error struct {
	Source Source
	Msg    string
}

func (e *Error) Error() string { return "nri-gpu: " + e.Source.String() + ": " + e.Msg }

func errorf(source Source, format string, args ...any) *Error {
	return &Error{Source: source, Msg: fmt.Sprintf(format, args...)}
}

// parseEnv parses NVIDIA_VISIBLE_DEVICES as the NVIDIA toolkit reads it:
// entries split on commas and trimmed, empty ones dropped.
func parseEnv(val string, caps envValue) (Request, error) {
	src := envSource(EnvVisibleDevices)
	if len(val) > maxEnvValue {
		return Request{}, errorf(src, "value is %d bytes long (at most %d)", len(val), maxEnvValue)
	}
	ids := make([]string, 0, min(strings.Count(val, ",")+1, maxDeviceList))
	for more := true; more; {
		var id string
		id, val, more = strings.Cut(val, ",")
		if id = strings.TrimSpace(id); id == "" {
			continue
		}
		if len(ids) == maxDeviceList {
			return Request{}, errorf(src, "more than %d device IDs", maxDeviceList)
		}
		ids = append(ids, id)
	}
	return visibleDevices(src, ids, caps)
}

// visibleDevices turns a list of device IDs (trimmed, non-empty) into a
// request exactly as the NVIDIA toolkit reads NVIDIA_VISIBLE_DEVICES: an
// empty list is nothing; the special values win over device IDs, in the
// order void (nothing), none (the driver without a GPU), all; otherwise
// the IDs, duplicates dropped, in their order. It reuses ids.
func visibleDevices(src Source, ids []string, capsEnv envValue) (Request, error) {
	r := Request{Source: src}
	switch {
	case len(ids) == 0 || slices.Contains(ids, "void"):
		return Request{}, nil
	case slices.Contains(ids, "none"):
		r.Kind = DriverOnly
	case slices.Contains(ids, "all"):
		r.Kind = All
	default:
		r.Kind = Devices
		r.IDs = dedupe(ids)
	}
	caps, capsSrc, err := envCapabilities(capsEnv)
	if err != nil {
		return Request{}, err
	}
	r.Caps, r.CapsSource = caps, capsSrc
	return r, nil
}

// dedupe drops repeated IDs, keeping the first of each, in one pass. It
// reuses ids.
func dedupe(ids []string) []string {
	if len(ids) < 2 {
		return ids
	}
	seen := make(map[string]struct{}, len(ids))
	out := ids[:0]
	for _, id := range ids {
		if _, dup := seen[id]; !dup {
			seen[id] = struct{}{}
			out = append(out, id)
		}
	}
	return out
}

// envCapabilities parses NVIDIA_DRIVER_CAPABILITIES; unset or empty gives
// the default set.
func envCapabilities(env envValue) (inventory.Capabilities, Source, error) {
	src := envSource(EnvDriverCapabilities)
	if len(env.val) > maxEnvValue {
		return 0, Source{}, errorf(src, "value is %d bytes long (at most %d)", len(env.val), maxEnvValue)
	}
	val := env.val
	if !env.ok || strings.TrimSpace(val) == "" {
		return inventory.DefaultCapabilities, Source{}, nil
	}
	caps, err := ParseCapabilities(val)
	if err != nil {
		return 0, Source{}, errorf(src, "%v", err)
	}
	return caps, src, nil
}

// ParseCapabilities parses a comma-separated list of driver capabilities
// ("compute,utility", "all"). Entries are trimmed; empty entries are
// ignored; an empty list is an error.
func ParseCapabilities(val string) (inventory.Capabilities, error) {
	var caps inventory.Capabilities
	n := 0
	for _, name := range strings.Split(val, ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		n++
		if name == "all" {
			caps |= inventory.AllCapabilities
			continue
		}
		c, ok := inventory.CapabilityByName(name)
		if !ok {
			return 0, fmt.Errorf("unsupported capability %s (valid: %s, all)", quote(name), strings.Join(inventory.CapabilityNames(), ", "))
		}
		caps = caps.With(c)
	}
	if n == 0 {
		return 0, fmt.Errorf("empty capability list (valid: %s, all)", strings.Join(inventory.CapabilityNames(), ", "))
	}
	return caps, nil
}

// maxAnnotation bounds an annotation value; real ones are a few dozen
// bytes, and Kubernetes bounds all annotations of a pod at 256 KiB.
const maxAnnotation = 4096

// annotationValid lists the fields of nri-gpu's annotation, for messages.
const annotationValid = `valid: "all", "N", "count=N", "device=ID[,ID...]" (quoted when it has commas), "capabilities=CAP[,CAP...]", "driver=nvidia", "exclusive=true|false", "imex-channels=all|N[,N...]" (quoted when it has commas)`

// parseAnnotation parses a value in the syntax of `docker run --gpus`:
// comma-separated CSV fields, each "all", a count, or key=value with keys
// count, device, capabilities, driver and exclusive. A field holding commas
// (device=0,2) is quoted, as Docker requires: "device=0,2".
func parseAnnotation(src Source, val string, capsEnv envValue) (Request, error) {
	if len(val) > maxAnnotation {
		return Request{}, errorf(src, "value is %d bytes long (at most %d)", len(val), maxAnnotation)
	}
	val = strings.TrimSpace(val)
	if val == "" {
		return Request{}, errorf(src, "empty value (%s)", annotationValid)
	}
	fields, err := splitFields(val)
	if err != nil {
		return Request{}, errorf(src, "malformed value %s: %v (%s)", quote(val), err, annotationValid)
	}
	r := Request{Source: src}
	seen := map[string]bool{}
	for i, field := range fields {
		field = strings.TrimSpace(field)
		if key, v, hasEq := strings.Cut(field, "="); hasEq {
			err = r.keyField(strings.TrimSpace(key), strings.TrimSpace(v), field, seen)
		} else {
			err = r.bareField(i, field, seen)
		}
		if err != nil {
			return Request{}, err
		}
	}
	if r.Kind == Nothing && seen[IMEXField] && len(seen) == 1 {
		// IMEX channels only: no GPU request.
		return Request{Source: src}, nil
	}
	if r.Kind == Nothing {
		return Request{}, errorf(src, "%s requests no GPU (%s)", quote(val), annotationValid)
	}
	if r.Caps == 0 {
		caps, capsSrc, err := envCapabilities(capsEnv)
		if err != nil {
			return Request{}, err
		}
		r.Caps, r.CapsSource = caps, capsSrc
	}
	return r, nil
}

// bareField reads field i of the annotation, one without "=": all or a
// count, first; seen records the fields read (keys, and count for these).
func (r *Request) bareField(i int, field string, seen map[string]bool) error {
	switch {
	case i == 0 && field == "all":
		r.Kind = All
	case i == 0 && isDigits(field):
		n, err := parseCount(field)
		if err != nil {
			return errorf(r.Source, "%v", err)
		}
		r.Kind, r.Count = Count, n
	case seen["device"] && isDigits(field):
		return errorf(r.Source, "unexpected field %s: quote a device list that has commas, as in '\"device=0,%s\"'", quote(field), field)
	case seen[IMEXField] && isDigits(field):
		return errorf(r.Source, "unexpected field %s: quote a channel list that has commas, as in '\"%s=0,%s\"'", quote(field), IMEXField, field)
	default:
		return errorf(r.Source, "unexpected field %s (%s)", quote(field), annotationValid)
	}
	seen["count"] = true
	return nil
}

// keyField reads the annotation's field key=v (field as written); a key
// may come once, and count and device exclude each other.
func (r *Request) keyField(key, v, field string, seen map[string]bool) error {
	src := r.Source
	if seen[key] || key == "count" && seen["device"] || key == "device" && seen["count"] {
		return errorf(src, "field %s conflicts with an earlier field (give one of all, N, count= or device=)", quote(field))
	}
	seen[key] = true
	switch key {
	case "count":
		if v == "all" {
			r.Kind = All
			return nil
		}
		n, err := parseCount(v)
		if err != nil {
			return errorf(src, "%v", err)
		}
		r.Kind, r.Count = Count, n
	case "device":
		return r.deviceIDs(v, field)
	case "capabilities":
		caps, err := ParseCapabilities(v)
		if err != nil {
			return errorf(src, "%v", err)
		}
		r.Caps, r.CapsSource = caps, src
	case "driver":
		if v != "nvidia" {
			return errorf(src, "unsupported driver %s (valid: nvidia)", quote(v))
		}
	case IMEXField:
		// The IMEX request of the annotation: parsed here to refuse
		// a bad value with the rest, and again by FindIMEX.
		if _, err := parseIMEXField(src, v); err != nil {
			return err
		}
	case "exclusive":
		var b bool
		switch v {
		case "true":
			b = true
		case "false":
		default:
			return errorf(src, "bad value %s for exclusive (valid: true, false)", quote(v))
		}
		r.Exclusive = &b
	default:
		return errorf(src, "unknown field %s (%s)", quote(key), annotationValid)
	}
	return nil
}

// deviceIDs reads the device= list v of field: IDs, trimmed, none empty,
// at most maxDeviceList.
func (r *Request) deviceIDs(v, field string) error {
	for _, id := range strings.Split(v, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			return errorf(r.Source, "empty device ID in %s", quote(field))
		}
		if len(r.IDs) == maxDeviceList {
			return errorf(r.Source, "more than %d device IDs", maxDeviceList)
		}
		r.IDs = append(r.IDs, id)
	}
	r.Kind = Devices
	return nil
}

// parseCount parses a GPU count: a positive decimal number.
func parseCount(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || !isDigits(s) || n < 1 {
		return 0, fmt.Errorf("bad GPU count %s (a number of at least 1, or all)", quote(s))
	}
	return n, nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// splitFields splits a value into its CSV fields. Values without quotes or
// line breaks (nearly all) are split on commas directly, which is what CSV
// does with them; the others go through encoding/csv.
func splitFields(val string) ([]string, error) {
	if !strings.ContainsAny(val, "\"\r\n") {
		return strings.Split(val, ","), nil
	}
	rd := csv.NewReader(strings.NewReader(val))
	rd.TrimLeadingSpace = true
	fields, err := rd.Read()
	if err != nil {
		return nil, errors.New(csvReason(err))
	}
	if _, err := rd.Read(); err == nil {
		return nil, errors.New("more than one line")
	}
	return fields, nil
}

// csvReason returns the CSV reader's reason without its position prefix.
func csvReason(err error) string {
	if pe, ok := err.(*csv.ParseError); ok {
		return pe.Err.Error()
	}
	return err.Error()
}
