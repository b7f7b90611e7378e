package deploy

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
)

var updateSchema = flag.Bool("update-schema", false, "rewrite values.schema.json's config from nri-gpu's configuration type")

// schemaFile is the chart's values.schema.json.
var schemaFile = filepath.Join(chartDir, "values.schema.json")

// readSchema decodes values.schema.json, keeping its key order for
// -update-schema.
func readSchema(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("%s: %v", schemaFile, err)
	}
	return s
}

// configSchema is the JSON schema of a value of type ty as nri-gpu's
// strict decoding takes it: an object of exactly the struct's json keys
// at every depth, arrays, the scalars' JSON types. A type that decodes
// itself (json.Unmarshaler) takes what its own decoder says.
func configSchema(ty reflect.Type) map[string]any {
	if reflect.PointerTo(ty).Implements(reflect.TypeFor[json.Unmarshaler]()) {
		return map[string]any{}
	}
	switch ty.Kind() {
	case reflect.Pointer:
		return configSchema(ty.Elem())
	case reflect.Struct:
		props := map[string]any{}
		for f := range ty.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if f.Anonymous && name == "" {
				for k, v := range configSchema(f.Type)["properties"].(map[string]any) {
					props[k] = v
				}
				continue
			}
			props[name] = configSchema(f.Type)
		}
		return map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": configSchema(ty.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": configSchema(ty.Elem())}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	}
	return map[string]any{}
}

// TestValuesSchema: values.schema.json holds every value of values.yaml
// (a value the schema lacks would fail every install) and no value
// values.yaml lacks; its config is nri-gpu's configuration type, key for
// key at every depth (go test -run TestValuesSchema -update-schema
// rewrites it after the type changes), so that a misspelt configuration
// key fails helm install instead of nri-gpu's start on every node.
func TestValuesSchema(t *testing.T) {
	schema := readSchema(t)
	want := configSchema(reflect.TypeFor[config.Config]())
	props := schema["properties"].(map[string]any)
	if *updateSchema {
		props["config"] = want
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(schema); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(schemaFile, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(want, props["config"]); diff != "" {
		t.Errorf("%s: config is not nri-gpu's configuration (rewrite it: go test -run TestValuesSchema -update-schema) (-Go type +schema):\n%s", schemaFile, diff)
	}

	values := chartValues(t)
	var missing, extra []string
	walkValues(values, schema, "", &missing)
	walkSchema(schema, values, "", &extra)
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("values.yaml has values values.schema.json lacks: %q", missing)
	}
	if len(extra) > 0 {
		t.Errorf("values.schema.json has values values.yaml lacks (give each a default): %q", extra)
	}
}

// walkValues adds to missing the paths of values under path that schema
// (an object's schema) has no property for, where it closes its
// properties.
func walkValues(values map[string]any, schema map[string]any, path string, missing *[]string) {
	if schema["additionalProperties"] != false {
		return // a map of names (labels, nodeSelector) or a Kubernetes object
	}
	props, _ := schema["properties"].(map[string]any)
	for k, v := range values {
		sub, ok := props[k].(map[string]any)
		if !ok {
			*missing = append(*missing, path+k)
			continue
		}
		if m, ok := v.(map[string]any); ok {
			walkValues(m, sub, path+k+".", missing)
		}
	}
}

// walkSchema adds to extra the schema's properties under path that
// values.yaml does not set, but within config (the schema has every key
// of nri-gpu's configuration, values.yaml the ones the chart sets) and
// global (a parent chart's).
func walkSchema(schema map[string]any, values map[string]any, path string, extra *[]string) {
	props, _ := schema["properties"].(map[string]any)
	for _, k := range sortedKeys(props) {
		if path == "" && (k == "config" || k == "global") {
			continue
		}
		v, ok := values[k]
		if !ok {
			*extra = append(*extra, path+k)
			continue
		}
		if m, ok := v.(map[string]any); ok {
			walkSchema(props[k].(map[string]any), m, path+k+".", extra)
		}
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TestSchemaRejectsTypos: a misspelt value, at the top, in the chart's
// own settings or in nri-gpu's configuration, and a value out of its
// range fail helm template and helm lint --strict, naming the key; the
// defaults pass helm lint --strict.
func TestSchemaRejectsTypos(t *testing.T) {
	if out, err := runHelm(t, "lint", "--strict", chartDir); err != nil {
		t.Fatalf("helm lint --strict with the defaults: %v\n%s", err, out)
	}
	for _, c := range []struct{ set, want string }{
		{"imagee.tag=1", "imagee"},
		{"metrics.serviceMonitor.enabeld=true", "enabeld"},
		{"config.devicePlugn.enabled=false", "devicePlugn"},
		{"config.policy.defaults=allow", "defaults"},
		{"networkPolicy.metricsfrom=x", "metricsfrom"},
		{"logFormat=yaml", "logFormat"},
		{"logLevel=verbose", "logLevel"},
		{"metricsPort=70000", "metricsPort"},
		{"goMemLimit=48M", "goMemLimit"},
		{"config.dra.enabled=yes", "enabled"},
	} {
		for _, cmd := range [][]string{{"template", "nri-gpu", chartDir}, {"lint", "--strict", chartDir}} {
			out, err := runHelm(t, append(cmd, "--set", c.set)...)
			if err == nil {
				t.Errorf("helm %s --set %s: accepted\n%.300s", cmd[0], c.set, out)
				continue
			}
			if msg := err.Error(); !strings.Contains(msg, "schema") || !strings.Contains(msg, c.want) {
				t.Errorf("helm %s --set %s: %v; want a schema error naming %q", cmd[0], c.set, err, c.want)
			}
		}
	}
}
