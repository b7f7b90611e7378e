// Package socket serves a unix socket at a path that another instance of
// nri-gpu may take over: the kubelet finds its plugins by the socket
// files in its directories, and for a while two nri-gpu pods of one node
// can both be alive (an uninstall and an install that overlap, a
// DaemonSet update with surge, a pod deleted without waiting). The newer
// one replaces the socket file; the older one, stopping later, must not
// remove it. A listener from net.Listen removes its path when it closes,
// whoever's file is there by then (Go's unlink on close), and so does the
// DRA helper's own listener (k8s.io/dynamic-resource-allocation
// kubeletplugin): with either, the older pod's exit unlinks the newer
// one's sockets, the kubelet unregisters the plugin, and the node's
// claims or device plugin pods wait until nri-gpu restarts.
package socket

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync"
)

// Listen serves a unix socket at path, replacing a socket file already
// there (a stale one, or a live one of an older instance, which the
// kubelet then stops using). Closing the listener removes path only if
// it is still the file Listen made.
func Listen(ctx context.Context, path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("removing the old socket %s: %w", path, err)
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	fi, err := os.Stat(path)
	if err != nil {
		_ = ul.Close()
		return nil, fmt.Errorf("the socket just made: %w", err)
	}
	return &listener{UnixListener: ul, path: path, made: fi}, nil
}

// listener is a unix listener that on Close removes its path only while
// the path is still its own file.
type listener struct {
	*net.UnixListener
	path string
	made fs.FileInfo
	once sync.Once
}

// Close stops listening and removes the socket file if it is still the
// one this listener made.
func (l *listener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if Owns(l.path, l.made) {
			if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = errors.Join(err, rerr)
			}
		}
	})
	return err
}

// Owns says whether path is still the file made: false once another
// instance has replaced it or it is gone.
func Owns(path string, made fs.FileInfo) bool {
	fi, err := os.Stat(path)
	return err == nil && Same(fi, made)
}

// Same says whether two stats are of the same socket file: the same
// device and inode, and the same modification time. An inode freed by
// removing a socket is often given at once to the next one made in the
// directory, so the inode alone would take a replacement for the
// original; the time, to the nanosecond, tells them apart.
func Same(a, b fs.FileInfo) bool {
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime())
}
