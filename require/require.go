// Package require checks the NVIDIA toolkit's requirement variables
// (NVIDIA_REQUIRE_*, and CUDA_VERSION of legacy images) of a container
// against the driver and the GPUs it is to get, with the toolkit's grammar
// and wording. Everything here is pure.
package require

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Requirement variables of the NVIDIA toolkit.
const (
	EnvRequirePrefix  = "NVIDIA_REQUIRE_"
	EnvDisableRequire = "NVIDIA_DISABLE_REQUIRE"
	// EnvRequireJetpack is ignored, as by the toolkit.
	EnvRequireJetpack = "NVIDIA_REQUIRE_JETPACK"
	// EnvCUDAVersion of a legacy image (no NVIDIA_REQUIRE_CUDA) means
	// cuda>=<major.minor>.
	EnvCUDAVersion = "CUDA_VERSION"
)

// Error is a requirement that does not hold or cannot be parsed. It names
// the variable that carries it.
type Error struct {
	// Variable is the environment variable, "NVIDIA_REQUIRE_CUDA".
	Variable string
	Msg      string
}

func (e *Error) Error() string { return "nri-gpu: env " + e.Variable + ": " + e.Msg }

func errorf(variable, format string, args ...any) *Error {
	return &Error{Variable: variable, Msg: fmt.Sprintf(format, args...)}
}

// NodeFacts is what requirements are checked against.
type NodeFacts struct {
	// CUDA is the driver's CUDA API version ("13.0"); empty if unknown.
	CUDA string
	// Driver is the driver version ("580.126.09").
	Driver string
}

// Condition is one "<property><op><value>" of a requirement.
type Condition struct {
	Property string // cuda, driver, arch or brand
	Op       string // =, !=, <, <=, >, >=
	Value    string
}

// Requirement is a parsed requirement expression: any of its terms must
// hold; a term holds when all its conditions hold.
type Requirement [][]Condition

// maxRequirement bounds a requirement expression; nvidia/cuda images' are
// a few hundred bytes.
const maxRequirement = 4096

// ParseRequirement parses an expression in the toolkit's grammar: terms
// separated by spaces are ORed, conditions separated by commas within a
// term are ANDed, e.g. "cuda>=12.0 brand=tesla,driver>=525".
func ParseRequirement(expr string) (Requirement, error) {
	if len(expr) > maxRequirement {
		return nil, fmt.Errorf("expression is %d bytes long (at most %d)", len(expr), maxRequirement)
	}
	var req Requirement
	for _, term := range strings.Fields(expr) {
		var and []Condition
		for _, c := range strings.Split(term, ",") {
			if c == "" {
				continue
			}
			cond, err := parseCondition(c)
			if err != nil {
				return nil, err
			}
			and = append(and, cond)
		}
		if len(and) > 0 {
			req = append(req, and)
		}
	}
	return req, nil
}

func parseCondition(s string) (Condition, error) {
	i := strings.IndexAny(s, "<>=!")
	if i <= 0 {
		return Condition{}, fmt.Errorf("invalid expression %s (want <property><op><value>, property one of cuda, driver, arch, brand)", quote(s))
	}
	c := Condition{Property: strings.ToLower(s[:i])}
	rest := s[i:]
	for _, op := range [...]string{">=", "<=", "!=", "=", "<", ">"} {
		if strings.HasPrefix(rest, op) {
			c.Op, c.Value = op, rest[len(op):]
			break
		}
	}
	if c.Op == "" || c.Value == "" || strings.ContainsAny(c.Value, "<>=!") {
		return Condition{}, fmt.Errorf("invalid expression %s (operators: =, !=, <, <=, >, >=)", quote(s))
	}
	switch c.Property {
	case "cuda", "driver", "arch":
		if _, ok := parseVersion(c.Value); !ok {
			return Condition{}, fmt.Errorf("invalid expression %s: %s is not a version", quote(s), quote(c.Value))
		}
	case "brand":
		if c.Op != "=" && c.Op != "!=" {
			return Condition{}, fmt.Errorf("invalid expression %s: brand compares with = or != only", quote(s))
		}
		c.Value = strings.ToLower(c.Value)
	default:
		return Condition{}, fmt.Errorf("invalid expression %s: unknown property %s (valid: cuda, driver, arch, brand)", quote(s), quote(c.Property))
	}
	return c, nil
}

// parseVersion parses a dotted decimal version of at most 4 parts.
func parseVersion(s string) ([4]int, bool) {
	var v [4]int
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return v, false
	}
	for i, p := range parts {
		if p == "" || len(p) > 9 || strings.Trim(p, "0123456789") != "" {
			return v, false
		}
		v[i], _ = strconv.Atoi(p)
	}
	return v, true
}

func compareVersions(a, b [4]int) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// holds evaluates c against the node and one GPU's arch and brand (empty
// when unknown, or when the container gets no GPU: then arch and brand
// conditions hold, there being nothing to compare).
func (c Condition) holds(n NodeFacts, arch, brand string, noGPU bool) bool {
	var have string
	switch c.Property {
	case "cuda":
		have = n.CUDA
	case "driver":
		have = n.Driver
	case "arch":
		if noGPU {
			return true
		}
		have = arch
	case "brand":
		if noGPU {
			return true
		}
		return (brand == c.Value) == (c.Op == "=")
	}
	hv, ok := parseVersion(have)
	want, _ := parseVersion(c.Value)
	if !ok {
		return false
	}
	cmp := compareVersions(hv, want)
	switch c.Op {
	case "=":
		return cmp == 0
	case "!=":
		return cmp != 0
	case "<":
		return cmp < 0
	case "<=":
		return cmp <= 0
	case ">":
		return cmp > 0
	}
	return cmp >= 0
}

// holds reports whether the requirement holds for every GPU (or for the
// node alone when gpus is empty).
func (r Requirement) holds(n NodeFacts, gpus []inventory.GPU) bool {
	check := func(arch, brand string, noGPU bool) bool {
		if len(r) == 0 {
			return true
		}
		for _, and := range r {
			ok := true
			for _, c := range and {
				if !c.holds(n, arch, brand, noGPU) {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
		return false
	}
	if len(gpus) == 0 {
		return check("", "", true)
	}
	for _, g := range gpus {
		if !check(GPUArch(g.Model), GPUBrand(g.Model), false) {
			return false
		}
	}
	return true
}

// Check checks the container's NVIDIA_REQUIRE_* variables
// (each must hold) against the node and the GPUs it is to get, unless
// NVIDIA_DISABLE_REQUIRE is true. A legacy image's CUDA_VERSION without
// NVIDIA_REQUIRE_CUDA requires cuda>=<its major.minor>. The error has the
// toolkit's wording.
func Check(env []string, n NodeFacts, gpus []inventory.GPU) error {
	if v, ok := getenv(env, EnvDisableRequire); ok {
		if b, _ := strconv.ParseBool(strings.TrimSpace(v)); b {
			return nil
		}
	}
	type req struct{ key, val string }
	var reqs []req
	hasCUDA := false
	for _, kv := range env {
		key, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(key, EnvRequirePrefix) || strings.HasPrefix(key, EnvRequireJetpack) {
			continue
		}
		if v, _ := getenv(env, key); v != val {
			continue // a later duplicate: the process sees the first
		}
		hasCUDA = hasCUDA || key == EnvRequirePrefix+"CUDA"
		reqs = append(reqs, req{key, val})
	}
	if v, ok := getenv(env, EnvCUDAVersion); ok && !hasCUDA && strings.TrimSpace(v) != "" {
		mv, ok := parseVersion(majorMinor(strings.TrimSpace(v)))
		if !ok {
			return errorf(EnvCUDAVersion, "invalid CUDA version %s", quote(v))
		}
		reqs = append(reqs, req{EnvCUDAVersion, fmt.Sprintf("cuda>=%d.%d", mv[0], mv[1])})
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].key < reqs[j].key })
	for _, rq := range reqs {
		r, err := ParseRequirement(rq.val)
		if err != nil {
			return errorf(rq.key, "requirement error: %v", err)
		}
		if !r.holds(n, gpus) {
			return errorf(rq.key, "requirement error: unsatisfied condition: %s, please update your driver to a newer version, or use an earlier cuda container", strings.Join(strings.Fields(truncateReq(rq.val)), " "))
		}
	}
	return nil
}

func majorMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) >= 2 {
		return parts[0] + "." + parts[1]
	}
	return v
}

func truncateReq(s string) string {
	if len(s) > 256 {
		return s[:256] + "..."
	}
	return s
}

// GPUArch returns the compute capability ("9.0") of a GPU model as
// /proc/driver/nvidia/gpus/*/information names it, from a table of known
// models; empty when unknown (an arch condition then does not hold).
func GPUArch(model string) string {
	m := strings.ToUpper(model)
	for _, e := range archByModel {
		for _, k := range e.keys {
			if strings.Contains(m, k) {
				return e.arch
			}
		}
	}
	return ""
}

// archByModel lists model name fragments by compute capability; earlier
// entries win, so longer fragments come before their prefixes.
var archByModel = []struct {
	arch string
	keys []string
}{
	{"12.0", []string{"RTX 50", "RTX PRO 6000", "RTX PRO 5000", "RTX PRO 4000"}},
	{"10.0", []string{"B200", "B100", "GB200"}},
	{"9.0", []string{"H100", "H200", "H800", "H20", "GH200"}},
	{"8.0", []string{"A100", "A800", "A30"}},
	{"8.9", []string{"L40", "L4", "L20", "RTX 40", "RTX 6000 ADA", "RTX 5000 ADA", "RTX 4000 ADA"}},
	{"8.6", []string{"A40", "A10", "A16", "A2", "RTX 30", "RTX A"}},
	{"7.5", []string{"T4", "RTX 20", "QUADRO RTX", "TITAN RTX", "GTX 16"}},
	{"7.0", []string{"V100", "TITAN V"}},
	{"6.1", []string{"P40", "P4", "GTX 10"}},
	{"6.0", []string{"P100"}},
}

// GPUBrand returns the brand of a GPU model in the toolkit's spelling
// (tesla, quadro, quadrortx, geforce, geforcertx, titan, titanrtx,
// nvidiartx, nvidia), from its name.
func GPUBrand(model string) string {
	m := strings.ToLower(strings.TrimPrefix(model, "NVIDIA "))
	switch {
	case strings.HasPrefix(m, "tesla"):
		return "tesla"
	case strings.HasPrefix(m, "quadro rtx"):
		return "quadrortx"
	case strings.HasPrefix(m, "quadro"):
		return "quadro"
	case strings.HasPrefix(m, "geforce rtx"):
		return "geforcertx"
	case strings.HasPrefix(m, "geforce"):
		return "geforce"
	case strings.HasPrefix(m, "titan rtx"):
		return "titanrtx"
	case strings.HasPrefix(m, "titan"):
		return "titan"
	case strings.HasPrefix(m, "rtx"):
		return "nvidiartx"
	}
	return "nvidia"
}

// getenv returns the value of key in env as the process would see it (the
// first entry wins, as with getenv(3)).
func getenv(env []string, key string) (string, bool) {
	for _, e := range env {
		if len(e) > len(key) && e[len(key)] == '=' && strings.HasPrefix(e, key) {
			return e[len(key)+1:], true
		}
	}
	return "", false
}

// quote quotes a user's token for a message, cutting very long ones.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}
