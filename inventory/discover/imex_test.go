package discover_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

func TestDiscoverIMEXChannels(t *testing.T) {
	n := generateWithNodes(t, simnode.Options{NumGPUs: 2, IMEXChannels: 3, UVMMajor: 244})
	major := int64(simnode.IMEXMajor(n.UVMMajor))
	dir := n.HostPath(simnode.IMEXDir)
	// Not channels: a wrong minor, a leading zero, a regular file, another name.
	if err := syscall.Mknod(filepath.Join(dir, "channel7"), syscall.S_IFCHR|0o666, int(simnode.Makedev(uint32(major), 8))); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"channel01", "readme"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := discoverAt(t, n.Root)
	if len(s.IMEXChannels) != 3 {
		t.Fatalf("IMEX channels %+v, want channel0-2", s.IMEXChannels)
	}
	for i, c := range s.IMEXChannels {
		want := inventory.DeviceNode{Path: inventory.IMEXChannelPath(i), Major: major, Minor: int64(i), Mode: 0o666}
		if c.Number != i || c.Node != want {
			t.Errorf("channel %d: %+v, want %+v", i, c, want)
		}
	}
	if got := inventory.IMEXRange(s.IMEXChannels); got != "0-2" {
		t.Errorf("IMEXRange %q, want 0-2", got)
	}
	if !strings.Contains(strings.Join(s.Warnings, "\n"), "channel7 is "+itoa(int(major))+":8, expected") || len(s.DeviceWarnings) != 0 {
		t.Errorf("want a warning about the wrong minor of channel7, not among the GPUs' device warnings: %q, %q", s.Warnings, s.DeviceWarnings)
	}
}

func TestDiscoverNoIMEXChannels(t *testing.T) {
	n := generateWithNodes(t, simnode.Options{NumGPUs: 1})
	s := discoverAt(t, n.Root)
	if len(s.IMEXChannels) != 0 || len(s.Warnings) != 0 {
		t.Errorf("a node without IMEX channels: channels %+v, warnings %q", s.IMEXChannels, s.Warnings)
	}
}

func TestParseIMEXChannelName(t *testing.T) {
	for name, want := range map[string]int{"channel0": 0, "channel1": 1, "channel2047": 2047, "channel1048575": 1048575} {
		if n, ok := discover.ParseIMEXChannelName(name); !ok || n != want {
			t.Errorf("%s: %d, %v; want %d", name, n, ok, want)
		}
	}
	for _, name := range []string{"channel", "channel01", "channel-1", "channel1048576", "chan1", "channel1 ", "channel+1"} {
		if n, ok := discover.ParseIMEXChannelName(name); ok {
			t.Errorf("%s: parsed as %d", name, n)
		}
	}
}
