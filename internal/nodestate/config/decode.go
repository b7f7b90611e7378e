package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	yamlv2 "go.yaml.in/yaml/v2"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// decodeStrict decodes the YAML document data into the struct *v. The YAML
// becomes JSON, which is decoded with keys matched case-sensitively and
// unknown and duplicate keys refused at every depth. Errors name the key
// and the path of its mapping from the top (key cdiImport: unknown field
// "SPECDIRS") and, for an unknown key, the valid keys of that mapping,
// read from v's json tags.
func decodeStrict(data []byte, v any) error {
	root := reflect.TypeOf(v).Elem()
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		// Strict YAML decoding refuses duplicate keys, naming the line
		// and the key but not where it sits.
		if path := duplicateKey(data); path != "" && strings.Contains(err.Error(), "already set in map") {
			parent, name, _ := level(root, path)
			return errors.New(fieldMessage(parent, "duplicate field", name) + " (a key may appear once)")
		}
		return errors.New(cleanYAMLError(err))
	}
	strict, err := sigsjson.UnmarshalStrict(j, v)
	if err != nil {
		return typeError(err)
	}
	if len(strict) == 0 {
		return nil
	}
	msgs := make([]string, len(strict))
	valid := make([]string, len(strict))
	for i, e := range strict {
		msgs[i], valid[i] = strictMessage(e, root)
	}
	// The valid keys of a level follow the last of its errors.
	for i := range msgs {
		if i+1 == len(msgs) || valid[i+1] != valid[i] {
			msgs[i] += valid[i]
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

// strictMessage explains an unknown or duplicate field: the path of its
// mapping, its key and a key of that mapping that differs only in case;
// valid lists the mapping's valid keys.
func strictMessage(e error, root reflect.Type) (msg, valid string) {
	var fe sigsjson.FieldError
	if !errors.As(e, &fe) {
		return e.Error(), ""
	}
	parent, name, keys := level(root, fe.FieldPath())
	if strings.HasPrefix(e.Error(), "duplicate field") {
		return fieldMessage(parent, "duplicate field", name) + " (a key may appear once)", ""
	}
	msg = fieldMessage(parent, "unknown field", name)
	for _, k := range keys {
		if strings.EqualFold(k, name) {
			msg += fmt.Sprintf(": keys are case-sensitive, did you mean %q?", k)
			break
		}
	}
	if len(keys) > 0 {
		valid = fmt.Sprintf(" (valid keys: %s)", strings.Join(keys, ", "))
	}
	return msg, valid
}

// fieldMessage says what is wrong with the key name of the mapping at
// parent: key cdiImport: unknown field "SPECDIRS", or unknown field "foo" at
// the top, as the other errors name keys.
func fieldMessage(parent, what, name string) string {
	msg := what + " " + strconv.Quote(name)
	if parent != "" {
		msg = "key " + parent + ": " + msg
	}
	return msg
}

// level splits a field path (policy.visibleDevice, a.b[0].c) into the
// longest prefix naming known fields of root and the key below it, and
// returns the json keys valid at that level (none if the prefix does not
// end at a struct).
func level(root reflect.Type, path string) (parent, name string, keys []string) {
	t := root
	rest := path
	for {
		seg, tail, more := strings.Cut(rest, ".")
		key, _, _ := strings.Cut(seg, "[")
		ft, ok := jsonField(t, key)
		if !more || !ok {
			return strings.TrimSuffix(strings.TrimSuffix(path, rest), "."), rest, jsonKeys(t)
		}
		t, rest = ft, tail
	}
}

// jsonField returns the type of t's field whose json key is exactly key,
// looking through pointers and lists.
func jsonField(t reflect.Type, key string) (reflect.Type, bool) {
	t = structOf(t)
	if t == nil {
		return nil, false
	}
	for i := 0; i < t.NumField(); i++ {
		if name, ok := jsonName(t.Field(i)); ok && name == key {
			return t.Field(i).Type, true
		}
	}
	return nil, false
}

// jsonKeys lists the json keys of the struct t (through pointers and
// lists), in field order.
func jsonKeys(t reflect.Type) []string {
	t = structOf(t)
	if t == nil {
		return nil
	}
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		if name, ok := jsonName(t.Field(i)); ok {
			keys = append(keys, name)
		}
	}
	return keys
}

func structOf(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	return t
}

// jsonName is the key encoding/json uses for f.
func jsonName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	tag := f.Tag.Get("json")
	if tag == "-" {
		return "", false
	}
	name, _, _ := strings.Cut(tag, ",")
	if name == "" {
		name = f.Name
	}
	return name, true
}

// typeError explains a value of the wrong kind (a list where a path
// belongs) in YAML's words, naming the key.
func typeError(err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return errors.New(cleanYAMLError(err))
	}
	want, got := describeType(te.Type), describeJSON(te.Value)
	if te.Field == "" {
		return fmt.Errorf("the configuration must be %s of keys, not %s", want, got)
	}
	msg := fmt.Sprintf("key %s: expected %s, got %s", te.Field, want, got)
	if want == "a string" && (got == "a number" || got == "a boolean") {
		msg += " (quote it: YAML reads unquoted numbers, true, false, yes, no, on and off as such)"
	}
	return errors.New(msg)
}

func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "a mapping"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "a number"
	}
	return t.String()
}

// describeJSON names a JSON value kind as UnmarshalTypeError gives it
// ("number", "number -5", "array", ...).
func describeJSON(v string) string {
	switch {
	case strings.HasPrefix(v, "number"):
		return "a number"
	case v == "string":
		return "a string"
	case v == "bool":
		return "a boolean"
	case v == "array":
		return "a list"
	case v == "object":
		return "a mapping"
	}
	return v
}

// duplicateKey returns the path of the first key that appears twice in
// one mapping of the YAML document data, or "".
func duplicateKey(data []byte) string {
	var m yamlv2.MapSlice
	if yamlv2.Unmarshal(data, &m) != nil {
		return ""
	}
	return findDuplicate(m, "")
}

func findDuplicate(v any, path string) string {
	switch v := v.(type) {
	case yamlv2.MapSlice:
		seen := make(map[string]bool, len(v))
		for _, it := range v {
			k := fmt.Sprint(it.Key)
			p := k
			if path != "" {
				p = path + "." + k
			}
			if seen[k] {
				return p
			}
			seen[k] = true
			if d := findDuplicate(it.Value, p); d != "" {
				return d
			}
		}
	case []any:
		for i, e := range v {
			if d := findDuplicate(e, path+"["+strconv.Itoa(i)+"]"); d != "" {
				return d
			}
		}
	}
	return ""
}

// cleanYAMLError strips the libraries' prefixes from decoding errors and
// puts a multi-line message on one line.
func cleanYAMLError(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "error converting YAML to JSON: ")
	s = strings.TrimPrefix(s, "error unmarshaling JSON: while decoding JSON: ")
	s = strings.TrimPrefix(s, "json: ")
	if strings.HasPrefix(s, "unsupported map key") {
		// sigs.k8s.io/yaml's message prints Go values (a null key).
		return "yaml: unsupported key: keys must be names"
	}
	return strings.ReplaceAll(s, "\n  ", " ")
}
