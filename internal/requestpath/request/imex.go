package request

import (
	"slices"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// IMEX channel request carriers.
const (
	// EnvIMEXChannels is the NVIDIA toolkit's variable for IMEX channels:
	// a comma list of channel numbers, or all.
	EnvIMEXChannels = "NVIDIA_IMEX_CHANNELS"
	// IMEXField is the field of nri-gpu's annotation that names IMEX
	// channels: imex-channels=0 or "imex-channels=0,1" (quoted when it
	// has commas, like device=), or imex-channels=all.
	IMEXField = "imex-channels"
	// DeviceListIMEX is where the NVIDIA device plugin's volume-mounts
	// strategy lists IMEX channels: /dev/null mounted at
	// /var/run/nvidia-container-devices/imex/<N>.
	DeviceListIMEX = DeviceListRoot + "/imex"
	// maxIMEXList bounds the channels one request names: the driver
	// makes 2048 channels by default.
	maxIMEXList = 2048
)

// IMEXRequest asks for IMEX channels (multi-node NVLink memory sharing):
// every channel of the node, or channels by number. It is a request of
// its own beside the GPU request: a container may ask for channels
// whatever GPUs it asks for.
type IMEXRequest struct {
	// Source is the carrier; NoSource when the container asks for none.
	Source Source
	// All asks for every channel of the node.
	All bool
	// Channels are the channel numbers asked for, duplicates dropped, in
	// the order given; Tokens are the same entries as the user wrote them.
	Channels []int
	Tokens   []string
}

// Empty reports whether the request asks for no channel.
func (r IMEXRequest) Empty() bool { return !r.All && len(r.Channels) == 0 }

// IMEXFound is a container's IMEX carrier, found by its key but not yet
// parsed, so that the policy decides before its value is read.
type IMEXFound struct {
	// Source is the carrier; NoSource when the container names none.
	Source Source
	val    string
	ids    []string
}

// FindIMEX finds the container's IMEX channel carrier, the first present
// of: the imex-channels field of nri-gpu's annotation (the one that
// applies to the container, as for GPUs), the device plugin's mounts
// under /var/run/nvidia-container-devices/imex, env NVIDIA_IMEX_CHANNELS
// (the NVIDIA toolkit reads the mounts before the variable too). Its work
// is bounded as Find's.
func FindIMEX(in Input) (IMEXFound, error) {
	var f IMEXFound
	if len(in.Env) > MaxEnvEntries {
		return f, errorf(Source{Kind: Env}, "%d entries (at most %d)", len(in.Env), MaxEnvEntries)
	}
	if err := CheckMounts(len(in.Mounts)); err != nil {
		return f, err
	}
	if key, val, ok := effectiveAnnotation(in.Annotations, AnnotationDomain, in.Name); ok && len(val) <= maxAnnotation && strings.Contains(val, IMEXField) {
		kind := PodAnnotation
		if key != AnnotationPod {
			kind = ContainerAnnotation
		}
		f.Source, f.val = Source{kind, key}, val
		return f, nil
	}
	var seen map[string]bool // linear in the mounts, whatever they repeat
	for i := range in.Mounts {
		id, ok, err := imexMountID(&in.Mounts[i])
		if err != nil {
			return IMEXFound{}, err
		}
		if ok && !seen[id] {
			if len(f.ids) == maxIMEXList {
				return IMEXFound{}, errorf(Source{DeviceList, DeviceListIMEX}, "more than %d channels", maxIMEXList)
			}
			if seen == nil {
				seen = map[string]bool{}
			}
			seen[id] = true
			f.ids = append(f.ids, id)
		}
	}
	if len(f.ids) > 0 {
		f.Source = Source{DeviceList, DeviceListIMEX}
		return f, nil
	}
	for _, e := range in.Env {
		if v, ok := strings.CutPrefix(e, EnvIMEXChannels+"="); ok {
			f.Source, f.val = envSource(EnvIMEXChannels), v
			return f, nil
		}
	}
	return f, nil
}

// imexMountID returns the channel a mount lists, if it is a device
// plugin's IMEX entry: /dev/null at /var/run/nvidia-container-devices/imex/<ID>.
func imexMountID(m *inventory.Mount) (string, bool, error) {
	if !strings.Contains(m.Destination, DeviceListName) {
		return "", false, nil
	}
	if len(m.Destination) > maxPath || len(m.Source) > maxPath {
		return "", false, errorf(Source{DeviceList, DeviceListIMEX}, "mount of %s at %s: path is longer than %d bytes", quote(m.Source), quote(m.Destination), maxPath)
	}
	dst := cleanPath(m.Destination)
	if !strings.HasPrefix(dst, DeviceListIMEX+"/") || m.Source != "/dev/null" && cleanPath(m.Source) != "/dev/null" {
		return "", false, nil
	}
	id := strings.Trim(dst[len(DeviceListIMEX):], "/")
	return id, id != "", nil
}

// Parse parses the carrier's value. Lists read as the NVIDIA toolkit reads
// NVIDIA_IMEX_CHANNELS: entries split on commas and trimmed, empty ones
// dropped; void or none anywhere in the list asks for nothing (the
// environment only); all asks for every channel; any other entry is a
// channel number, N or channelN (decimal, no leading zero, at most
// 1048575). The annotation field takes all or numbers.
func (f IMEXFound) Parse() (IMEXRequest, error) {
	switch f.Source.Kind {
	case ContainerAnnotation, PodAnnotation:
		return imexFromAnnotation(f.Source, f.val)
	case DeviceList:
		return imexList(f.Source, f.ids, false)
	case Env:
		if len(f.val) > maxEnvValue {
			return IMEXRequest{}, errorf(f.Source, "value is %d bytes long (at most %d)", len(f.val), maxEnvValue)
		}
		var ids []string
		for _, id := range strings.Split(f.val, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
		return imexList(f.Source, ids, true)
	}
	return IMEXRequest{}, nil
}

// imexFromAnnotation finds the imex-channels field of an nri-gpu
// annotation value and parses it. The value as a whole is checked by the
// GPU request's parse (parseAnnotation), which accepts the field.
func imexFromAnnotation(src Source, val string) (IMEXRequest, error) {
	fields, err := splitFields(strings.TrimSpace(val))
	if err != nil {
		return IMEXRequest{}, errorf(src, "malformed value %s: %v", quote(val), err)
	}
	for _, field := range fields {
		key, v, ok := strings.Cut(strings.TrimSpace(field), "=")
		if ok && strings.TrimSpace(key) == IMEXField {
			return parseIMEXField(src, v)
		}
	}
	return IMEXRequest{}, nil
}

// parseIMEXField parses the value of the imex-channels field: all, or a
// comma list of channel numbers.
func parseIMEXField(src Source, v string) (IMEXRequest, error) {
	var ids []string
	for _, id := range strings.Split(v, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			return IMEXRequest{}, errorf(src, "empty channel in field %s=%s (valid: all, or channel numbers such as %s=0 or \"%s=0,1\")", IMEXField, quote(v), IMEXField, IMEXField)
		}
		ids = append(ids, id)
	}
	return imexList(src, ids, false)
}

// imexList turns a list of channel entries (trimmed, non-empty) into a
// request; void and none are taken (as asking for nothing) only where
// special is set: the environment, as the toolkit reads it.
func imexList(src Source, ids []string, special bool) (IMEXRequest, error) {
	const valid = "valid: all, or channel numbers 0 to 1048575 (N or channelN)"
	r := IMEXRequest{Source: src}
	if len(ids) > maxIMEXList {
		return IMEXRequest{}, errorf(src, "more than %d channels", maxIMEXList)
	}
	if special && (slices.Contains(ids, "void") || slices.Contains(ids, "none")) {
		return IMEXRequest{}, nil
	}
	if slices.Contains(ids, "all") {
		r.All = true
		return r, nil
	}
	seen := make(map[int]bool, len(ids))
	for _, id := range ids {
		n, ok := parseIMEXChannel(id)
		if !ok {
			return IMEXRequest{}, errorf(src, "bad IMEX channel %s (%s)", quote(id), valid)
		}
		if !seen[n] {
			seen[n] = true
			r.Channels = append(r.Channels, n)
			r.Tokens = append(r.Tokens, id)
		}
	}
	if len(r.Channels) == 0 {
		return IMEXRequest{}, nil
	}
	return r, nil
}

// parseIMEXChannel parses N or channelN: decimal, no leading zero (the
// toolkit would look for a node channel01, which the driver never makes),
// at most inventory.MaxIMEXChannel.
func parseIMEXChannel(id string) (int, bool) {
	num := strings.TrimPrefix(id, "channel")
	if num == "" || len(num) > 7 || len(num) > 1 && num[0] == '0' || !isDigits(num) {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n > inventory.MaxIMEXChannel {
		return 0, false
	}
	return n, true
}

// SelectIMEX resolves r against the node's channels (sorted by number):
// every channel for all, else the channels named. A channel the node does
// not have is an error naming the request's source, the token and the
// channels the node has; so is all on a node without channels.
func SelectIMEX(r IMEXRequest, chans []inventory.IMEXChannel) ([]inventory.IMEXChannel, error) {
	if r.Empty() {
		return nil, nil
	}
	if r.All {
		if len(chans) == 0 {
			return nil, errorf(r.Source, "all IMEX channels requested, but the node has none (%s is empty or missing; see nri-gpu inventory)", inventory.IMEXChannelDir)
		}
		return chans, nil
	}
	out := make([]inventory.IMEXChannel, 0, len(r.Channels))
	for i, n := range r.Channels {
		j, ok := slices.BinarySearchFunc(chans, n, func(c inventory.IMEXChannel, n int) int { return c.Number - n })
		if !ok {
			return nil, errorf(r.Source, "unknown IMEX channel %s (node has %s)", quote(r.Tokens[i]), inventory.IMEXRange(chans))
		}
		out = append(out, chans[j])
	}
	return out, nil
}
