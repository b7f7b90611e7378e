package mps

import (
	"context"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch is how the two sides of the MPS handshake wake each other: it
// returns a channel that receives when an entry of one of dirs is
// created, written, renamed or removed (inotify), and at least every
// fallback. The handshake's files are written by a rename into their
// directory (the DRA checkpoint into dra.pluginDir, a ready file into
// its daemon's directory), so the reader wakes within milliseconds of
// the write; the fallback catches what inotify cannot tell (a directory
// that does not exist yet is watched from the next wake-up on; an event
// queue that overflowed). Wake-ups are coalesced: one waits at most. The
// watch ends with ctx. Cost: one inotify watch per directory, and a read
// of the watched file per wake-up by the caller.
func Watch(ctx context.Context, fallback time.Duration, dirs ...string) <-chan struct{} {
	out := make(chan struct{}, 1)
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		fsw = nil // the fallback alone
	}
	watched := map[string]bool{}
	add := func() {
		for _, d := range dirs {
			if fsw != nil && !watched[d] && fsw.Add(d) == nil {
				watched[d] = true
			}
		}
	}
	add()
	go func() {
		if fsw != nil {
			defer fsw.Close()
		}
		t := time.NewTicker(fallback)
		defer t.Stop()
		var events <-chan fsnotify.Event
		var errs <-chan error
		if fsw != nil {
			events, errs = fsw.Events, fsw.Errors
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case _, ok := <-events:
				if !ok {
					events = nil
				}
			case _, ok := <-errs:
				if !ok {
					errs = nil
				}
			}
			add()
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	return out
}
