package alloc

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// Annotation is the container annotation in which the plugin records what
// a container holds, so that the table can be rebuilt from the runtime's
// containers after a restart of the plugin or of the runtime.
const Annotation = "nri-gpu.dev/allocation"

// RecordVersion is the version of Record that Encode writes. The record
// is the one piece of nri-gpu's state that outlives a process and an
// upgrade (it is on the containers, and the table is rebuilt from it), so
// it says which form it has: a reader decodes the versions it knows and
// refuses a newer one rather than guess at it. A record without a version
// is of the form nri-gpu wrote before records had one: the same fields as
// version 1, and read as such.
const RecordVersion = 1

// Record is the value of Annotation: the mode and the UUIDs of the GPUs
// (UUIDs, not indices, since they name a GPU whatever the inventory). A
// record that names no GPU says that nri-gpu answered the container and
// booked nothing for it (a management container, which gets every GPU's
// node and holds none).
type Record struct {
	// Version is the record's form (RecordVersion when Encode wrote it);
	// 0 for a record written before records had a version.
	Version int      `json:"version,omitempty"`
	Mode    string   `json:"mode"`
	GPUs    []string `json:"gpus"`
	// Pod is set when the GPUs are the pod's (a pod-level request, held
	// by PodHolder and shared by all its containers), not the container's
	// own.
	Pod bool `json:"pod,omitempty"`
}

// Encode returns the annotation value, of version RecordVersion whatever
// r.Version says: {"version":1,"mode":"exclusive","gpus":["GPU-..."]}.
// Modes, UUIDs and CDI device names need no JSON escaping, so they are
// written directly (this is on the request path); anything else goes
// through encoding/json.
func (r Record) Encode() string {
	r.Version = RecordVersion
	if r.GPUs == nil || !plainJSON(r.Mode) || slices.ContainsFunc(r.GPUs, func(s string) bool { return !plainJSON(s) }) {
		b, _ := json.Marshal(r) // cannot fail: strings only
		return string(b)
	}
	n := 48 + len(r.Mode)
	for _, g := range r.GPUs {
		n += len(g) + 3
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(`{"version":`)
	b.WriteString(strconv.Itoa(r.Version))
	b.WriteString(`,"mode":"`)
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

// DecodeRecord parses an annotation value made by Encode, of any version
// up to RecordVersion (one without a version, as nri-gpu wrote them before
// records had one, too). A record of a newer version, written by a newer
// nri-gpu, is an error: its fields may mean something this one does not
// know, so it is not read.
func DecodeRecord(s string) (Record, sharing.Mode, error) {
	var r Record
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return Record{}, 0, fmt.Errorf("annotation %s: %q: %v", Annotation, s, err)
	}
	if r.Version < 0 || r.Version > RecordVersion {
		return Record{}, 0, fmt.Errorf("annotation %s: record version %d, which this nri-gpu cannot read (it reads versions up to %d; a newer nri-gpu wrote it?)",
			Annotation, r.Version, RecordVersion)
	}
	m, err := sharing.ParseMode(r.Mode)
	if err != nil {
		return Record{}, 0, fmt.Errorf("annotation %s: %v", Annotation, err)
	}
	return r, m, nil
}
