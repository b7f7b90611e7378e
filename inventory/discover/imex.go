package discover

import (
	"cmp"
	"errors"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// imexMajorName is the /proc/devices name of the IMEX channels' major.
const imexMajorName = "nvidia-caps-imex-channels"

// maxIMEXEntries bounds the entries of /dev/nvidia-caps-imex-channels
// that are looked at: the driver makes NVreg_ImexChannelCount channels,
// 2048 by default.
const maxIMEXEntries = 4096

// imexChannels discovers the IMEX channel nodes:
// /dev/nvidia-caps-imex-channels/channel<N>, character devices of the
// nvidia-caps-imex-channels major with minor N. A node without the major
// or the directory has none (no warning: most nodes are not part of a
// multi-node NVLink domain); a node whose numbers are wrong is skipped
// with a warning.
func (d *discovery) imexChannels(majors map[string]int64) {
	major, ok := majors[imexMajorName]
	if !ok {
		return
	}
	rel := strings.TrimPrefix(inventory.IMEXChannelDir, "/")
	dir, err := openNoBlock(d.host, rel)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			d.warnf("listing IMEX channels: %v", err)
		}
		return
	}
	names, err := dir.Readdirnames(maxIMEXEntries + 1)
	dir.Close()
	if err != nil && len(names) == 0 {
		d.warnf("listing IMEX channels: %v", err)
		return
	}
	if len(names) > maxIMEXEntries {
		d.warnf("%s holds more than %d entries: only %d are looked at", inventory.IMEXChannelDir, maxIMEXEntries, maxIMEXEntries)
		names = names[:maxIMEXEntries]
	}
	for _, name := range names {
		n, ok := ParseIMEXChannelName(name)
		if !ok {
			continue
		}
		p := path.Join(inventory.IMEXChannelDir, name)
		node := d.imexNode(p, major, int64(n))
		if node == nil {
			continue
		}
		d.snap.IMEXChannels = append(d.snap.IMEXChannels, inventory.IMEXChannel{Number: n, Node: *node})
	}
	slices.SortFunc(d.snap.IMEXChannels, func(a, b inventory.IMEXChannel) int { return cmp.Compare(a.Number, b.Number) })
}

// ParseIMEXChannelName returns N of a node named channel<N>: N decimal,
// without leading zeros, at most inventory.MaxIMEXChannel.
func ParseIMEXChannelName(name string) (int, bool) {
	num, ok := strings.CutPrefix(name, "channel")
	if !ok || num == "" || len(num) > 7 || len(num) > 1 && num[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(num); i++ {
		if num[i] < '0' || num[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(num)
	if err != nil || n > inventory.MaxIMEXChannel {
		return 0, false
	}
	return n, true
}

// imexNode is node for an IMEX channel: a problem is a warning of its
// own, not one of the GPUs' device nodes (nri-gpu doctor's kernel layer
// judges the GPUs).
func (d *discovery) imexNode(p string, major, minor int64) *inventory.DeviceNode {
	n, err := CharDevice(d.host, p)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			d.warnf("IMEX channel: %v: not offered", err)
		}
		return nil
	}
	if n.Major != major || n.Minor != minor {
		d.warnf("IMEX channel %s is %d:%d, expected %d:%d: not offered", p, n.Major, n.Minor, major, minor)
		return nil
	}
	return &n
}
