package alloc

import (
	"encoding/json"
	"fmt"
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
}

// Encode returns the annotation value: {"mode":"exclusive","gpus":["GPU-..."]}.
func (r Record) Encode() string {
	b, _ := json.Marshal(r) // cannot fail: strings only
	return string(b)
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
