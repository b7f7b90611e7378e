package libcache_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/libcache"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// BenchmarkBuild measures a first build of the cache (an empty cache
// directory, every library directory of an 8-GPU simulated node made) in
// the two layouts: "link", the cache in the driver root's mount (nri-gpu
// on the host: hard links), and "copy", the DaemonSet's (the driver root
// bind-mounted read-only, the cache directory of the same file system
// mounted read-write elsewhere: one copy of each file). It reports the
// bytes of file data each build wrote (stored-B/op) and the files stored.
func BenchmarkBuild(b *testing.B) {
	for _, layout := range []string{"link", "copy"} {
		b.Run(layout, func(b *testing.B) {
			n, err := simnode.Generate(b.TempDir(), simnode.Options{NumGPUs: 8})
			if err != nil {
				b.Fatal(err)
			}
			snap, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root})
			if err != nil {
				b.Fatal(err)
			}
			o := libcache.Options{DriverRoot: n.Root, DriverRootMount: n.Root, Dir: "var/lib/nri-gpu"}
			host := filepath.Join(n.Root, o.Dir)
			if err := os.MkdirAll(host, 0o755); err != nil {
				b.Fatal(err)
			}
			if layout == "copy" {
				if os.Geteuid() != 0 {
					b.Skip("needs root: bind mounts")
				}
				pod := b.TempDir()
				o.DriverRootMount, o.DirMount = filepath.Join(pod, "driver-root"), filepath.Join(pod, "cache")
				for _, m := range [][2]string{{n.Root, o.DriverRootMount}, {host, o.DirMount}} {
					os.MkdirAll(m[1], 0o755)
					if err := syscall.Mount(m[0], m[1], "", syscall.MS_BIND, ""); err != nil {
						b.Fatal(err)
					}
					defer syscall.Unmount(m[1], syscall.MNT_DETACH)
				}
				syscall.Mount("", o.DriverRootMount, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, "")
			}
			var stored, files int64
			for b.Loop() {
				b.StopTimer()
				// Empty the cache directory (kept: it is mounted).
				entries, _ := os.ReadDir(host)
				for _, e := range entries {
					if err := os.RemoveAll(filepath.Join(host, e.Name())); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				c, err := libcache.Build(snap, o)
				if err != nil {
					b.Fatal(err)
				}
				stored, files = c.StoredBytes, int64(c.Stored)
			}
			b.ReportMetric(float64(stored), "stored-B/op")
			b.ReportMetric(float64(files), "stored-files/op")
		})
	}
}
