package alloc

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Annotation is the container annotation in which the plugin records what
// a container holds, so that the table can be rebuilt from the runtime's
// containers after a restart of the plugin or of the runtime.
const Annotation = "nri-gpu.dev/allocation"

// Record is the value of Annotation: the mode and the UUIDs of the GPUs
// (UUIDs, not indices, since they name a GPU whatever the inventory).
type Record struct {
	Mode string   `json:"mode"`
	GPUs []string `json:"gpus"`
	// Pod is set when the GPUs are the pod's (a pod-level request, held
	// by PodHolder and shared by all its containers), not the container's
	// own.
	Pod bool `json:"pod,omitempty"`
}

// Encode returns the annotation value: {"mode":"exclusive","gpus":["GPU-..."]}.
// Modes, UUIDs and CDI device names need no JSON escaping, so they are
// written directly (this is on the request path); anything else goes
// through encoding/json.
func (r Record) Encode() string {
	if r.GPUs == nil || !plainJSON(r.Mode) || slices.ContainsFunc(r.GPUs, func(s string) bool { return !plainJSON(s) }) {
		b, _ := json.Marshal(r) // cannot fail: strings only
		return string(b)
	}
	n := 35 + len(r.Mode)
	for _, g := range r.GPUs {
		n += len(g) + 3
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(`{"mode":"`)
	b.WriteString(r.Mode)
	b.WriteString(`","gpus":[`)
	for i, g := range r.GPUs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(g)
		b.WriteByte('"')
	}
	b.WriteByte(']')
	if r.Pod {
		b.WriteString(`,"pod":true`)
	}
	b.WriteByte('}')
	return b.String()
}

// plainJSON reports whether s can be written in a JSON string as is.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// DecodeRecord parses an annotation value made by Encode.
func DecodeRecord(s string) (Record, Mode, error) {
	var r Record
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return Record{}, 0, fmt.Errorf("annotation %s: %q: %v", Annotation, s, err)
	}
	m, err := ParseMode(r.Mode)
	if err != nil {
		return Record{}, 0, fmt.Errorf("annotation %s: %v", Annotation, err)
	}
	return r, m, nil
}
