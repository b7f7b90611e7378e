package simnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// IMEXDir is where the driver's IMEX channel nodes are:
// /dev/nvidia-caps-imex-channels/channel<N>, major of the
// nvidia-caps-imex-channels line of /proc/devices, minor N.
const IMEXDir = "/dev/nvidia-caps-imex-channels"

// maxIMEXChannels bounds Options.IMEXChannels: the driver's default
// NVreg_ImexChannelCount is 2048.
const maxIMEXChannels = 2048

// IMEXMajor returns the major /proc/devices gives
// nvidia-caps-imex-channels on a node whose nvidia-uvm major is uvm (a
// dynamic major, as the kernel hands them out).
func IMEXMajor(uvm int) int {
	next := 511
	for _, name := range dynamicCharDevices {
		if next == uvm {
			next--
		}
		if name == "nvidia-caps-imex-channels" {
			return next
		}
		next--
	}
	panic("simnode: nvidia-caps-imex-channels is not a dynamic device")
}

// IMEXChannelPath returns the node path of IMEX channel n.
func IMEXChannelPath(n int) string { return fmt.Sprintf("%s/channel%d", IMEXDir, n) }

// writeIMEXChannels creates channel0..channel<count-1> as the driver does
// (character devices with c.deviceNodes, else empty files), mode 0666,
// after removing what an earlier Generate left there.
func writeIMEXChannels(root string, c *config) error {
	dir := filepath.Join(root, filepath.FromSlash(IMEXDir))
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if c.imexChannels == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	major := IMEXMajor(c.uvmMajor)
	for i := 0; i < c.imexChannels; i++ {
		p := filepath.Join(root, filepath.FromSlash(IMEXChannelPath(i)))
		if c.deviceNodes {
			if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(Makedev(uint32(major), uint32(i)))); err != nil {
				return fmt.Errorf("simnode: mknod %s (%d:%d): %w", p, major, i, err)
			}
		} else {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
			if err != nil {
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		}
		if err := os.Chmod(p, 0o666); err != nil {
			return err
		}
	}
	return nil
}

// checkIMEX validates Options.IMEXChannels.
func checkIMEX(n int) error {
	if n < 0 || n > maxIMEXChannels {
		return errors.New("simnode: IMEXChannels must be 0 to 2048")
	}
	return nil
}
