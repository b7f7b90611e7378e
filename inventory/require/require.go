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

func (e *Error) Error() string {
	if e.Variable == "" {
		return "nri-gpu: env: " + e.Msg // the environment as a whole
	}
	return "nri-gpu: env " + e.Variable + ": " + e.Msg
}

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
	// version is Value parsed, for cuda, driver and arch: parsed once,
	// not per GPU.
	version [4]int
}

// Requirement is a parsed requirement expression: any of its terms must
// hold; a term holds when all its conditions hold.
type Requirement [][]Condition

// Bounds on the requirements of one container: with them, checking a
// container's environment costs at most a few tens of microseconds, however
// many variables a pod author writes (see the request path's bounds,
// request.MaxEnvEntries).
const (
	// maxRequirement bounds a requirement expression; nvidia/cuda images'
	// are a few hundred bytes, 1.5 KiB for the longest (CUDA 11).
	maxRequirement = 4096
	// maxVariables bounds the NVIDIA_REQUIRE_* entries of a container;
	// images set one or two.
	maxVariables = 32
	// maxTotal bounds the requirement expressions of a container
	// together.
	maxTotal = 16 << 10
	// maxEnvEntries bounds the environment entries looked at, as the
	// request path's request.MaxEnvEntries.
	maxEnvEntries = 1 << 14
)

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
		var ok bool
		if c.version, ok = parseVersion(c.Value); !ok {
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

// parseVersion parses a dotted decimal version of at most 4 parts of at
// most 9 digits each, in one pass and without allocating.
func parseVersion(s string) ([4]int, bool) {
	var v [4]int
	part, digits := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			if digits == 0 || part == 3 {
				return [4]int{}, false
			}
			part, digits = part+1, 0
		case c >= '0' && c <= '9' && digits < 9:
			v[part] = v[part]*10 + int(c-'0')
			digits++
		default:
			return [4]int{}, false
		}
	}
	if digits == 0 {
		return [4]int{}, false
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

// facts are the node's and one GPU's versions, parsed once per check.
type facts struct {
	cuda, driver, arch       [4]int
	cudaOK, driverOK, archOK bool
	brand                    string
	noGPU                    bool
}

// holds evaluates c against the node and one GPU's arch and brand
// (unknown arch: an arch condition does not hold; no GPU: arch and brand
// conditions hold, there being nothing to compare).
func (c *Condition) holds(f *facts) bool {
	var have [4]int
	var ok bool
	switch c.Property {
	case "cuda":
		have, ok = f.cuda, f.cudaOK
	case "driver":
		have, ok = f.driver, f.driverOK
	case "arch":
		if f.noGPU {
			return true
		}
		have, ok = f.arch, f.archOK
	case "brand":
		if f.noGPU {
			return true
		}
		return (f.brand == c.Value) == (c.Op == "=")
	}
	if !ok {
		return false
	}
	cmp := compareVersions(have, c.version)
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
// node alone when gpus is empty). Each distinct GPU model is evaluated
// once: the cost is the number of conditions times the node's models.
func (r Requirement) holds(n NodeFacts, gpus []inventory.GPU) bool {
	if len(r) == 0 {
		return true
	}
	var f facts
	f.cuda, f.cudaOK = parseVersion(n.CUDA)
	f.driver, f.driverOK = parseVersion(n.Driver)
	check := func() bool {
		for _, and := range r {
			ok := true
			for i := range and {
				if !and[i].holds(&f) {
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
		f.noGPU = true
		return check()
	}
	done := make(map[string]bool, 1)
	for _, g := range gpus {
		if done[g.Model] {
			continue
		}
		done[g.Model] = true
		f.arch, f.archOK = parseVersion(GPUArch(g.Model))
		f.brand = GPUBrand(g.Model)
		if !check() {
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
//
// It makes one pass over the environment, which is bounded at
// maxEnvEntries entries, maxVariables requirement variables of
// maxRequirement bytes each and maxTotal bytes together; more is an error.
func Check(env []string, n NodeFacts, gpus []inventory.GPU) error {
	if len(env) > maxEnvEntries {
		return errorf("", "%d entries (at most %d)", len(env), maxEnvEntries)
	}
	e := scanEnv(env)
	if b, _ := strconv.ParseBool(strings.TrimSpace(e.disable)); e.hasDisable && b {
		return nil
	}
	switch {
	case e.count > maxVariables:
		return errorf(EnvRequirePrefix+"*", "%d requirement variables (at most %d)", e.count, maxVariables)
	case e.total > maxTotal:
		return errorf(EnvRequirePrefix+"*", "requirement variables are %d bytes long together (at most %d)", e.total, maxTotal)
	}
	reqs, hasCUDA := firstByName(e.reqs)
	if v := strings.TrimSpace(e.cudaVersion); !hasCUDA && v != "" {
		if len(v) > maxRequirement {
			return errorf(EnvCUDAVersion, "value is %d bytes long (at most %d)", len(v), maxRequirement)
		}
		mv, ok := parseVersion(majorMinor(v))
		if !ok {
			return errorf(EnvCUDAVersion, "invalid CUDA version %s", quote(e.cudaVersion))
		}
		reqs = append(reqs, req{EnvCUDAVersion, fmt.Sprintf("cuda>=%d.%d", mv[0], mv[1])})
		sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].key < reqs[j].key })
	}
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

// req is a requirement variable: its name and value.
type req struct{ key, val string }

// requireEnv is what Check reads of the environment.
type requireEnv struct {
	// reqs are the requirement variables, in their order, as far as
	// they are within maxVariables and maxTotal; count and total are
	// all of them, and their bytes.
	reqs         []req
	count, total int
	// disable and cudaVersion are NVIDIA_DISABLE_REQUIRE's and
	// CUDA_VERSION's first values, if set.
	disable, cudaVersion       string
	hasDisable, hasCUDAVersion bool
}

// scanEnv reads the requirement variables, NVIDIA_DISABLE_REQUIRE and
// CUDA_VERSION in one pass: a look at the first byte and a prefix pass
// over nearly every entry; only a requirement variable is split.
func scanEnv(env []string) requireEnv {
	var e requireEnv
	for _, kv := range env {
		if kv == "" || kv[0] != 'N' && kv[0] != 'C' {
			continue
		}
		if v, ok := strings.CutPrefix(kv, EnvCUDAVersion+"="); ok {
			if !e.hasCUDAVersion {
				e.cudaVersion, e.hasCUDAVersion = v, true
			}
			continue
		}
		if v, ok := strings.CutPrefix(kv, EnvDisableRequire+"="); ok {
			if !e.hasDisable {
				e.disable, e.hasDisable = v, true
			}
			continue
		}
		if !strings.HasPrefix(kv, EnvRequirePrefix) || strings.HasPrefix(kv, EnvRequireJetpack) {
			continue
		}
		key, val, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		e.count++
		if e.total += len(val); e.count <= maxVariables && e.total <= maxTotal {
			e.reqs = append(e.reqs, req{key, val})
		}
	}
	return e
}

// firstByName sorts reqs by name and keeps the first entry of each name,
// the one the process sees; it says whether NVIDIA_REQUIRE_CUDA is among
// them. It reuses reqs.
func firstByName(reqs []req) ([]req, bool) {
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].key < reqs[j].key })
	out := reqs[:0]
	hasCUDA := false
	for i, rq := range reqs {
		if i > 0 && rq.key == reqs[i-1].key {
			continue
		}
		hasCUDA = hasCUDA || rq.key == EnvRequirePrefix+"CUDA"
		out = append(out, rq)
	}
	return out, hasCUDA
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

// quote quotes a user's token for a message, cutting very long ones.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}
