package alloc

import (
	"fmt"
	"strconv"
	"strings"
)

// KubeletSharedPrefix starts the container annotation in which nri-gpu's
// kubelet device plugin says that the devices it gave a container for one
// resource are replicas of shared GPUs: KubeletSharedAnnotation(resource).
// One key per resource, since the kubelet keeps one value per key when it
// merges the Allocate answers of several resources. It rides beside
// KubeletAnnotation (the GPUs' UUIDs) and is to be trusted as that one is,
// and only as far as the node's own sharing plan agrees: the plan says
// which GPUs are shared and how; the annotation says how many replicas of
// each this container was given.
const KubeletSharedPrefix = "gpus.nri-gpu.dev/kubelet-shared."

// KubeletSharedAnnotation returns the shared-replicas annotation's key for
// a resource ("nvidia.com/gpu.shared": gpus.nri-gpu.dev/kubelet-shared.nvidia.com_gpu.shared).
func KubeletSharedAnnotation(resource string) string {
	return KubeletSharedPrefix + strings.ReplaceAll(resource, "/", "_")
}

// KubeletShares is the value of a shared-replicas annotation: the
// strategy, then each GPU with how many of its replicas the container was
// given and how many it has: "mps:GPU-a=1/4,GPU-b=1/4".
type KubeletShares struct {
	// Strategy is "time-slicing" or "mps".
	Strategy string
	Shares   []KubeletShare
}

// KubeletShare is one GPU (or MIG device) of a KubeletShares.
type KubeletShare struct {
	UUID string
	// Given is how many of its replicas the container was given (1
	// unless failRequestsGreaterThanOne is false); Replicas how many
	// the device is advertised as.
	Given, Replicas int
}

// maxKubeletShares bounds the entries of a shared-replicas annotation, and
// maxKubeletSharesLen its length.
const (
	maxKubeletShares    = 256
	maxKubeletSharesLen = 64 << 10
)

// String formats s as the annotation's value.
func (s KubeletShares) String() string {
	var b strings.Builder
	b.WriteString(s.Strategy)
	for i, sh := range s.Shares {
		b.WriteByte(map[bool]byte{true: ':', false: ','}[i == 0])
		fmt.Fprintf(&b, "%s=%d/%d", sh.UUID, sh.Given, sh.Replicas)
	}
	return b.String()
}

// ParseKubeletShares reads a shared-replicas annotation's value; bounded
// and linear. An error says what is wrong and what is valid.
func ParseKubeletShares(v string) (KubeletShares, error) {
	if len(v) > maxKubeletSharesLen {
		return KubeletShares{}, fmt.Errorf("%d bytes (at most %d)", len(v), maxKubeletSharesLen)
	}
	strategy, list, ok := strings.Cut(v, ":")
	if !ok || (strategy != "time-slicing" && strategy != "mps") {
		return KubeletShares{}, fmt.Errorf("%q does not start with a strategy (time-slicing or mps) and a colon", cut(v))
	}
	entries := strings.Split(list, ",")
	if len(entries) > maxKubeletShares {
		return KubeletShares{}, fmt.Errorf("%d devices (at most %d)", len(entries), maxKubeletShares)
	}
	out := KubeletShares{Strategy: strategy}
	seen := map[string]bool{}
	for _, e := range entries {
		uuid, frac, ok1 := strings.Cut(e, "=")
		given, replicas, ok2 := strings.Cut(frac, "/")
		g, err1 := strconv.Atoi(given)
		r, err2 := strconv.Atoi(replicas)
		if !ok1 || !ok2 || err1 != nil || err2 != nil || uuid == "" || g < 1 || r < 2 || g > r || r > 1024 ||
			strings.ContainsFunc(uuid, func(c rune) bool { return c <= ' ' || c > '~' }) {
			return KubeletShares{}, fmt.Errorf("device %q is not <uuid>=<given>/<replicas> with 1 <= given <= replicas, 2 <= replicas <= 1024", cut(e))
		}
		if seen[uuid] {
			return KubeletShares{}, fmt.Errorf("device %s is listed twice", cut(uuid))
		}
		seen[uuid] = true
		out.Shares = append(out.Shares, KubeletShare{UUID: uuid, Given: g, Replicas: r})
	}
	return out, nil
}

// cut cuts s for a message.
func cut(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
