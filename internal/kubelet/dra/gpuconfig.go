package dra

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kjson "sigs.k8s.io/json"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// The opaque device configurations nri-gpu's driver accepts: NVIDIA's
// DRA driver's GpuConfig and MigDeviceConfig (resource.nvidia.com/v1beta1),
// so that a claim written for NVIDIA's driver carries over with the same
// meaning. MigDeviceConfig is GpuConfig for MIG devices, its sharing
// without timeSlicingConfig.
const (
	GpuConfigAPIVersion = "resource.nvidia.com/v1beta1"
	GpuConfigKind       = "GpuConfig"
	MigDeviceConfigKind = "MigDeviceConfig"
)

// Sharing strategies of GpuConfig.sharing.strategy, NVIDIA's names.
const (
	StrategyTimeSlicing = "TimeSlicing"
	StrategyMPS         = "MPS"
)

// IntervalDefault is the one timeSlicingConfig.interval nri-gpu accepts:
// it sets no time slice of its own (NVIDIA's driver runs nvidia-smi
// compute-policy --set-timeslice for Short, Medium and Long).
const IntervalDefault = "Default"

// maxConfigBytes bounds the opaque parameters read (the API server
// allows 10 KiB: resourceapi.OpaqueParametersMaxLength).
const maxConfigBytes = resourceapi.OpaqueParametersMaxLength

// gpuConfig is GpuConfig as nri-gpu reads it: NVIDIA's fields, and no
// other, decoded as NVIDIA's driver decodes it (apimachinery's strict
// decoding, decodeStrict).
type gpuConfig struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Sharing    *gpuSharing `json:"sharing,omitempty"`
}

type gpuSharing struct {
	Strategy          string             `json:"strategy"`
	TimeSlicingConfig *timeSlicingConfig `json:"timeSlicingConfig,omitempty"`
	MpsConfig         *mpsConfig         `json:"mpsConfig,omitempty"`
}

type timeSlicingConfig struct {
	Interval *string `json:"interval,omitempty"`
}

type mpsConfig struct {
	DefaultActiveThreadPercentage     *int                         `json:"defaultActiveThreadPercentage,omitempty"`
	DefaultPinnedDeviceMemoryLimit    *resource.Quantity           `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
	DefaultPerDevicePinnedMemoryLimit map[string]resource.Quantity `json:"defaultPerDevicePinnedMemoryLimit,omitempty"`
	MultiUser                         *bool                        `json:"multiUser,omitempty"`
}

// Sharing is how a claim's device is shared between the containers and
// pods of its claim, from its GpuConfig: Strategy "" (none asked: the
// containers of the claim share the GPU as the driver time-slices them),
// StrategyTimeSlicing (the same, said explicitly), or StrategyMPS with
// MPS's limits.
type Sharing struct {
	Strategy string
	// MPS is set under StrategyMPS: the limits the claim's MPS control
	// daemon holds each client process to. ActiveThreadPercentage is
	// defaultActiveThreadPercentage, 100 when unset (the daemon's own
	// default); PinnedMemoryMiB is defaultPerDevicePinnedMemoryLimit of
	// the device, else defaultPinnedDeviceMemoryLimit, in MiB; 0 for
	// none.
	MPS *sharing.MPSLimits
}

// configField names a field of the claim's config for messages.
func configField(at int, class bool, path string) string {
	src := "claim spec.devices.config"
	if class {
		src = "class config (status.allocation.devices.config)"
	}
	return fmt.Sprintf("%s[%d].opaque.parameters%s", src, at, path)
}

// parsedConfig is one of the allocation's configurations of this driver.
type parsedConfig struct {
	requests []string
	// mig is set for a MigDeviceConfig.
	mig     bool
	sharing Sharing
	// perDevice are defaultPerDevicePinnedMemoryLimit's entries (MiB),
	// resolved against the device when it is applied; field names it.
	perDevice map[string]uint64
	field     string
	// deflt is defaultPinnedDeviceMemoryLimit (MiB), 0 for none.
	deflt uint64
}

// parseConfigs reads the allocation's opaque configurations of driver,
// in NVIDIA's order of precedence (the class's, then the claim's; later
// over earlier). Another driver's are skipped; a non-opaque one, or one
// of this driver that is not a valid GpuConfig, is an error naming the
// field, the bad token and what is valid. Bounded: at most 32
// configurations (the API's limit) of at most 10 KiB each.
func parseConfigs(driver string, cfgs []resourceapi.DeviceAllocationConfiguration) ([]parsedConfig, error) {
	var class, claim []int
	for i, c := range cfgs {
		if c.Source == resourceapi.AllocationConfigSourceClass {
			class = append(class, i)
		} else {
			claim = append(claim, i)
		}
	}
	if len(cfgs) > 2*resourceapi.DeviceConfigMaxSize {
		return nil, fmt.Errorf("%d device configurations, more than the API's %d", len(cfgs), 2*resourceapi.DeviceConfigMaxSize)
	}
	var out []parsedConfig
	// Indexes within their own source, as the user wrote them.
	for _, src := range [][]int{class, claim} {
		for at, i := range src {
			c := cfgs[i]
			isClass := c.Source == resourceapi.AllocationConfigSourceClass
			if c.Opaque == nil {
				// A configuration nri-gpu cannot read may be another
				// driver's; only opaque ones name their driver.
				continue
			}
			if c.Opaque.Driver != driver {
				continue
			}
			p, err := parseGpuConfig(c.Opaque.Parameters.Raw, func(path string) string { return configField(at, isClass, path) })
			if err != nil {
				return nil, err
			}
			p.requests = c.Requests
			out = append(out, p)
		}
	}
	return out, nil
}

// parseGpuConfig reads one GpuConfig; field names a path in it.
func parseGpuConfig(raw []byte, field func(string) string) (parsedConfig, error) {
	if len(raw) > maxConfigBytes {
		return parsedConfig{}, fmt.Errorf("%s: %d bytes, more than %d", field(""), len(raw), maxConfigBytes)
	}
	var g gpuConfig
	if err := decodeStrict(raw, &g); err != nil {
		return parsedConfig{}, fmt.Errorf("%s: not a %s %s: %s (valid fields, case-sensitive, each once: apiVersion, kind, sharing.strategy, sharing.timeSlicingConfig.interval, "+
			"sharing.mpsConfig.defaultActiveThreadPercentage, .defaultPinnedDeviceMemoryLimit, .defaultPerDevicePinnedMemoryLimit, .multiUser)",
			field(""), GpuConfigAPIVersion, GpuConfigKind, jsonProblem(err))
	}
	if g.APIVersion != GpuConfigAPIVersion {
		return parsedConfig{}, fmt.Errorf("%s: apiVersion %q is not one nri-gpu reads (valid: %s)", field(".apiVersion"), g.APIVersion, GpuConfigAPIVersion)
	}
	if g.Kind != GpuConfigKind && g.Kind != MigDeviceConfigKind {
		return parsedConfig{}, fmt.Errorf("%s: kind %q is not one nri-gpu reads (valid: %s, %s; VfioDeviceConfig is NVIDIA's driver's alone)", field(".kind"), g.Kind, GpuConfigKind, MigDeviceConfigKind)
	}
	p := parsedConfig{field: field(".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"), mig: g.Kind == MigDeviceConfigKind}
	s := g.Sharing
	if p.mig && s != nil && s.TimeSlicingConfig != nil {
		// NVIDIA's MigDeviceSharing has no such field: its strict
		// decoding refuses it.
		return parsedConfig{}, fmt.Errorf("%s: unknown field in a %s (valid fields of its sharing: strategy, mpsConfig)", field(".sharing.timeSlicingConfig"), MigDeviceConfigKind)
	}
	if s == nil {
		return p, nil
	}
	switch s.Strategy {
	case StrategyTimeSlicing:
		if s.MpsConfig != nil {
			return parsedConfig{}, fmt.Errorf("%s: set with strategy %s; it goes with strategy %s only", field(".sharing.mpsConfig"), StrategyTimeSlicing, StrategyMPS)
		}
		if ts := s.TimeSlicingConfig; ts != nil && ts.Interval != nil && *ts.Interval != IntervalDefault {
			return parsedConfig{}, fmt.Errorf("%s: %q is not supported by nri-gpu (valid: %s; nri-gpu sets no time slice of its own: Short, Medium and Long are NVIDIA's driver's alone)",
				field(".sharing.timeSlicingConfig.interval"), *ts.Interval, IntervalDefault)
		}
		p.sharing = Sharing{Strategy: StrategyTimeSlicing}
	case StrategyMPS:
		if s.TimeSlicingConfig != nil {
			return parsedConfig{}, fmt.Errorf("%s: set with strategy %s; it goes with strategy %s only", field(".sharing.timeSlicingConfig"), StrategyMPS, StrategyTimeSlicing)
		}
		lim := &sharing.MPSLimits{ActiveThreadPercentage: 100}
		if m := s.MpsConfig; m != nil {
			if t := m.DefaultActiveThreadPercentage; t != nil {
				if *t < 1 || *t > 100 {
					return parsedConfig{}, fmt.Errorf("%s: %d is not a percentage of the GPU's threads (valid: 1 to 100)", field(".sharing.mpsConfig.defaultActiveThreadPercentage"), *t)
				}
				lim.ActiveThreadPercentage = *t
			}
			if m.MultiUser != nil && *m.MultiUser {
				return parsedConfig{}, fmt.Errorf("%s: true is not supported by nri-gpu (valid: false; its MPS control daemon serves the clients of one user, as MPS does by default)", field(".sharing.mpsConfig.multiUser"))
			}
			if q := m.DefaultPinnedDeviceMemoryLimit; q != nil {
				mib, err := mebibytes(*q, field(".sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"))
				if err != nil {
					return parsedConfig{}, err
				}
				p.deflt = mib
			}
			if len(m.DefaultPerDevicePinnedMemoryLimit) > 0 {
				p.perDevice = map[string]uint64{}
				for k, q := range m.DefaultPerDevicePinnedMemoryLimit {
					mib, err := mebibytes(q, field(".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit["+strconv.Quote(k)+"]"))
					if err != nil {
						return parsedConfig{}, err
					}
					p.perDevice[k] = mib
				}
			}
		}
		p.sharing = Sharing{Strategy: StrategyMPS, MPS: lim}
	default:
		return parsedConfig{}, fmt.Errorf("%s: %q is not a sharing strategy (valid: %s, %s)", field(".sharing.strategy"), s.Strategy, StrategyTimeSlicing, StrategyMPS)
	}
	return p, nil
}

// decodeStrict decodes raw into v as apimachinery's strict decoding does
// (NVIDIA's driver reads GpuConfig so, sigs.k8s.io/json.UnmarshalStrict):
// field names case-sensitive, a field given twice or unknown refused, one
// JSON value. encoding/json matches names case-insensitively and keeps the
// last of a repeated field: an admission policy reading
// "defaultActiveThreadPercentage": 10 beside a later
// "DefaultActiveThreadPercentage": 100 would see 10 where nri-gpu applied
// 100.
func decodeStrict(raw []byte, v any) error {
	strict, err := kjson.UnmarshalStrict(raw, v)
	if err != nil || len(strict) == 0 {
		return err
	}
	msgs := make([]string, len(strict))
	for i, e := range strict {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}

// mebibytes is q in MiB, as NVIDIA's driver converts it (rounded down):
// less than 1 MiB, or more than an int64 of bytes, is refused.
func mebibytes(q resource.Quantity, field string) (uint64, error) {
	v, ok := q.AsInt64()
	if !ok {
		return 0, fmt.Errorf("%s: %s is not a whole number of bytes that fits in 64 bits (valid: a memory size such as 8Gi)", field, q.String())
	}
	if v>>20 < 1 {
		return 0, fmt.Errorf("%s: %s is less than 1Mi (valid: a memory size such as 8Gi)", field, q.String())
	}
	return uint64(v >> 20), nil
}

// jsonProblem is a decoding error as a short message.
func jsonProblem(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "json: ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// applies reports whether a configuration of requests applies to the
// result of request r ("req" or "req/sub"): every request when it names
// none, else r or its parent request.
func applies(requests []string, r string) bool {
	if len(requests) == 0 {
		return true
	}
	parent, _, _ := strings.Cut(r, "/")
	return slices.Contains(requests, r) || slices.Contains(requests, parent)
}

// sharingFor returns the sharing of the device uuid (a MIG device when
// mig) of request r: the last configuration of its kind that applies
// (NVIDIA's precedence, and its v0.5.0 matching: a MigDeviceConfig
// applies to MIG devices and passes a GPU by, named or not; a GpuConfig
// to GPUs, and in nri-gpu also to a MIG device no MigDeviceConfig
// applies to, which NVIDIA's driver passes by), its per-device memory
// limit resolved against the device ("0", the only index of a
// one-device MPS claim, or its UUID).
func sharingFor(cfgs []parsedConfig, r, uuid string, mig bool) (Sharing, error) {
	var last, gpuKind *parsedConfig
	for i := range cfgs {
		c := &cfgs[i]
		switch {
		case !applies(c.requests, r), c.mig && !mig:
		case c.mig || !mig:
			last = c
		default:
			gpuKind = c
		}
	}
	if last == nil {
		last = gpuKind
	}
	if last == nil {
		return Sharing{}, nil
	}
	s := last.sharing
	if s.MPS == nil {
		return s, nil
	}
	lim := *s.MPS
	lim.PinnedMemoryMiB = last.deflt
	keys := make([]string, 0, len(last.perDevice))
	for k := range last.perDevice {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if k != "0" && !strings.EqualFold(k, uuid) {
			return Sharing{}, fmt.Errorf("%s: key %q names no device of the claim's MPS control daemon (valid: 0 or %s)", last.field, k, uuid)
		}
		lim.PinnedMemoryMiB = last.perDevice[k]
	}
	s.MPS = &lim
	return s, nil
}
