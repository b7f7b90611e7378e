package node

import (
	"io"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestGPUSetsNote checks the one log line that says which graphics and
// display containers go without the application profile and by-path
// links: none on a node of up to 8 GPUs with a library cache; one with
// libraryMode: files, and one on a node of more than 8 GPUs; each logged
// once, not again at a rediscovery that finds the same.
func TestGPUSetsNote(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		gpus int
		mode config.LibraryMode
		want string
	}{
		{2, config.LibraryAuto, ""},
		{2, config.LibraryFiles, "GPU sets: no library cache (libraryMode files, key libraryMode): graphics and display containers go without"},
		{9, config.LibraryAuto, "GPU sets: the node has 9 GPUs, more than 8: the application profile and /dev/dri/by-path links are prepared for each GPU alone and for all 9 together"},
	} {
		sn, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: tc.gpus, DeviceNodes: true})
		if err != nil {
			t.Fatal(err)
		}
		cfg := config.Default()
		cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount, cfg.LibraryMode = sn.Root, sn.Root, sn.Root, tc.mode
		log, hook := logtest.NewNullLogger()
		log.SetOutput(io.Discard)
		n, err := New(cfg, log)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Reload(cfg); err != nil {
			t.Fatal(err)
		}
		var notes []string
		for _, e := range hook.AllEntries() {
			if strings.HasPrefix(e.Message, "GPU sets:") {
				notes = append(notes, e.Message)
				if e.Level != logrus.InfoLevel {
					t.Errorf("%d GPUs, %s: level %s", tc.gpus, tc.mode, e.Level)
				}
			}
		}
		if tc.want == "" && len(notes) != 0 || tc.want != "" && (len(notes) != 1 || !strings.HasPrefix(notes[0], tc.want)) {
			t.Errorf("%d GPUs, libraryMode %s: logged %q, want once %q", tc.gpus, tc.mode, notes, tc.want)
		}
	}
}
