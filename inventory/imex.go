package inventory

import (
	"fmt"
	"strings"
)

// IMEXChannelDir is the directory of the driver's IMEX channel nodes,
// channel<N> with the major of /proc/devices' nvidia-caps-imex-channels
// and minor N: what lets a container import memory that other nodes of
// an NVLink domain (GB200 NVL72) export through the IMEX daemon.
const IMEXChannelDir = "/dev/nvidia-caps-imex-channels"

// MaxIMEXChannel is the highest IMEX channel number (channel numbers are
// device minors, which have 20 bits).
const MaxIMEXChannel = 1<<20 - 1

// IMEXChannel is one IMEX channel of the node.
type IMEXChannel struct {
	// Number is N of channel<N>.
	Number int
	Node   DeviceNode
}

// IMEXChannelPath returns the node path of channel n.
func IMEXChannelPath(n int) string { return fmt.Sprintf("%s/channel%d", IMEXChannelDir, n) }

// IMEXRange describes the channel numbers of chans (sorted by number) for
// error messages: "0-3", "0,2-3", or "none".
func IMEXRange(chans []IMEXChannel) string {
	if len(chans) == 0 {
		return "none"
	}
	var b strings.Builder
	for i := 0; i < len(chans); {
		j := i
		for j+1 < len(chans) && chans[j+1].Number == chans[j].Number+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if i == j {
			fmt.Fprint(&b, chans[i].Number)
		} else {
			fmt.Fprintf(&b, "%d-%d", chans[i].Number, chans[j].Number)
		}
		i = j + 1
	}
	return b.String()
}
