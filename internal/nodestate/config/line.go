package config

import (
	"regexp"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
)

// keyInError finds the key a Parse error names: "key policy.visibleDevices:
// ...", "key policy: unknown field "envnamespaces"", "unknown field "foo"".
var keyInError = regexp.MustCompile(`^(?:key ([^ :]+): )?(?:(?:unknown|duplicate) field "([^"]+)")?`)

// Line returns ":N", the line of data where the key that err (an error of
// Parse) names is, for messages of the form FILE:N; "" when err names no
// key that data has.
func Line(data []byte, err error) string {
	m := keyInError.FindStringSubmatch(err.Error())
	if m == nil || m[1] == "" && m[2] == "" {
		return ""
	}
	path := m[1]
	if m[2] != "" {
		if path != "" {
			path += "."
		}
		path += m[2]
	}
	var doc yamlv3.Node
	if yamlv3.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return ""
	}
	if n := keyLine(doc.Content[0], path); n > 0 {
		return ":" + strconv.Itoa(n)
	}
	return ""
}

// keyLine returns the line of the key at path (a.b[2].c) under node, or
// of the deepest part of path that node has (the mapping of an unknown
// key reports the unknown key itself when present); 0 when none.
func keyLine(node *yamlv3.Node, path string) int {
	line := 0
	for _, seg := range strings.Split(path, ".") {
		name, idx, hasIdx := strings.Cut(seg, "[")
		var next *yamlv3.Node
		if node.Kind == yamlv3.MappingNode {
			// The last of duplicate keys is the one a duplicate error
			// means.
			for i := 0; i+1 < len(node.Content); i += 2 {
				if node.Content[i].Value == name {
					line, next = node.Content[i].Line, node.Content[i+1]
				}
			}
		}
		if next == nil {
			return line
		}
		node = next
		if hasIdx {
			n, err := strconv.Atoi(strings.TrimSuffix(idx, "]"))
			if err != nil || node.Kind != yamlv3.SequenceNode || n < 0 || n >= len(node.Content) {
				return line
			}
			node = node.Content[n]
			line = node.Line
		}
	}
	return line
}
