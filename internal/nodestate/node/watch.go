package node

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdispec"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Defaults of WatchOptions.
const (
	// DefaultWatchInterval is how often the node is rediscovered when no
	// file event says it changed: procfs and sysfs (the kernel module's
	// version) send no events.
	DefaultWatchInterval = 30 * time.Second
	// DefaultDebounce is how long a burst of file events (a driver
	// upgrade writes dozens of files) must be quiet before rediscovery.
	DefaultDebounce = 500 * time.Millisecond
)

// Update rediscovers the node with cfg and makes the result current,
// unless discovery fails or finds a broken driver (see
// inventory.Snapshot.DriverProblem): then the last good configuration and
// snapshot stay, the log says why, and an error is returned. A result equal
// to the current state is not swapped. why names what caused the update,
// for the log. The connection to the runtime is not touched: requests in
// flight finish with the old snapshot, later ones get the new.
func (n *Node) Update(cfg config.Config, why string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.update(cfg, why)
}

// refresh rediscovers the node with its current configuration, as Update
// does.
func (n *Node) refresh(why string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cur := n.state.Load(); cur != nil {
		_, _ = n.update(cur.Config, why)
	}
}

// update is Update; the caller holds mu.
func (n *Node) update(cfg config.Config, why string) (string, error) {
	cur := n.state.Load()
	log := n.log.WithField("cause", why)
	d, err := n.discover(cfg)
	if err != nil {
		err = fmt.Errorf("inventory: %w", err)
		n.logProblem(log, err.Error())
		n.observer().Refresh(RefreshError)
		return RefreshError, err
	}
	snap := d.snap
	if problem := snap.DriverProblem(); problem != "" && cur != nil {
		n.logProblem(log, "broken driver: "+problem)
		n.observer().Refresh(RefreshRejected)
		return RefreshRejected, fmt.Errorf("inventory: broken driver: %s", problem)
	}
	n.lastProblem = ""
	if cur != nil && reflect.DeepEqual(cur.Config, cfg) && reflect.DeepEqual(cur.Snapshot(), snap) && !cdiNamesChanged(cur, cfg, snap) {
		log.Debug("inventory unchanged")
		n.applyHealth()
		n.observer().Refresh(RefreshUnchanged)
		return RefreshUnchanged, nil
	}
	if err := n.install(cfg, d); err != nil {
		n.logProblem(log, err.Error())
		n.observer().Refresh(RefreshError)
		return RefreshError, err
	}
	// Logged once the new state is current: whoever reads this line
	// (an operator, a test) may start a container that must get it.
	if cur != nil {
		fields := logrus.Fields{}
		if old := cur.Snapshot().DriverVersion; old != snap.DriverVersion {
			fields["from"], fields["to"] = old, snap.DriverVersion
		}
		if !reflect.DeepEqual(cur.Config, cfg) {
			fields["config"] = "changed"
		}
		log.WithFields(fields).Info("inventory refreshed")
	}
	n.observer().Refresh(RefreshChanged)
	return RefreshChanged, nil
}

// cdiNamesChanged reports whether, with emit: cdi, the runtime's CDI specs
// now define other GPUs than the current state names (a spec was
// regenerated while the node itself stayed the same).
func cdiNamesChanged(cur *State, cfg config.Config, snap *inventory.Snapshot) bool {
	if cfg.Emit != config.EmitCDI {
		return false
	}
	names, _ := cdispec.Resolvable(snap, underRoot(cfg.HostRoot, cfg.CDISpecDirs))
	return !maps.Equal(names, cur.CDINames)
}

// logProblem logs why an update was not applied: as a warning the first
// time, at debug level while the same problem persists. The caller holds
// mu.
func (n *Node) logProblem(log *logrus.Entry, problem string) {
	if cur := n.state.Load(); cur != nil {
		s := cur.Snapshot()
		log = log.WithFields(logrus.Fields{"driver": s.DriverVersion, "gpus": len(s.GPUs), "files": len(s.Files)})
	}
	if problem == n.lastProblem {
		log.Debugf("%s: keeping the last good inventory", problem)
		return
	}
	n.lastProblem = problem
	log.Warnf("%s: keeping the last good inventory", problem)
}

// WatchOptions say what a Watcher follows.
type WatchOptions struct {
	// ConfigPath is the configuration file to follow; empty: none.
	ConfigPath string
	// Interval is the period of rediscovery without file events; zero
	// means DefaultWatchInterval, a negative value none.
	Interval time.Duration
	// Debounce is the quiet time after file events before rediscovery;
	// zero means DefaultDebounce.
	Debounce time.Duration
}

// Watcher follows the node and the configuration file: it rediscovers the
// node when the driver's files, the kernel module's version or the
// configuration file change (fsnotify, with a periodic fallback) and
// swaps the result in through Node.Update.
type Watcher struct {
	n       *Node
	o       WatchOptions
	fsw     *fsnotify.Watcher
	kick    chan string
	watched []string
	// cfgData is the configuration file's content last read; desired is
	// the last valid configuration read from it (with a ConfigPath).
	cfgData []byte
	desired config.Config
}

// NewWatcher returns a watcher of the node and of o.ConfigPath. The
// configuration the node runs with is taken as the file's current content.
func (n *Node) NewWatcher(o WatchOptions) (*Watcher, error) {
	if o.Interval == 0 {
		o.Interval = DefaultWatchInterval
	}
	if o.Debounce == 0 {
		o.Debounce = DefaultDebounce
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching files: %w", err)
	}
	w := &Watcher{n: n, o: o, fsw: fsw, kick: make(chan string, 1), desired: n.Config()}
	if o.ConfigPath != "" {
		w.cfgData, _ = os.ReadFile(o.ConfigPath)
	}
	w.rewatch()
	return w, nil
}

// Kick asks for a rediscovery now, rereading the configuration file even
// if it looks unchanged (SIGHUP). why names the cause, for the log.
func (w *Watcher) Kick(why string) {
	select {
	case w.kick <- why:
	default: // one is pending already
	}
}

// Run follows the node until ctx is cancelled.
func (w *Watcher) Run(ctx context.Context) {
	defer w.fsw.Close()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	var tick <-chan time.Time
	if w.o.Interval > 0 {
		t := time.NewTicker(w.o.Interval)
		defer t.Stop()
		tick = t.C
	}
	pending := ""
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			if pending == "" {
				pending = "file " + ev.Name
			}
			debounce.Reset(w.o.Debounce)
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			w.n.log.WithError(err).Warn("watching files; the periodic rediscovery continues")
		case why := <-w.kick:
			w.refresh(why, true)
		case <-debounce.C:
			w.refresh(pending, false)
			pending = ""
		case <-tick:
			w.refresh("periodic", false)
		}
	}
}

// refresh rereads the configuration file when it changed (or when forced)
// and updates the plugin.
func (w *Watcher) refresh(why string, force bool) {
	log := w.n.log.WithField("cause", why)
	cfg := w.n.Config() // a pre-registered plugin's came from the runtime
	if w.o.ConfigPath != "" {
		data, err := os.ReadFile(w.o.ConfigPath)
		switch {
		case err != nil:
			if force || w.cfgData != nil {
				log.WithError(err).Error("config: keeping the current configuration")
			}
			w.cfgData = nil
		case force || !bytes.Equal(data, w.cfgData):
			w.cfgData = data
			c, err := config.Parse(data)
			if err != nil {
				log.WithError(fmt.Errorf("config %s: %w", w.o.ConfigPath, err)).Error("invalid configuration rejected: keeping the current one")
				break
			}
			if !reflect.DeepEqual(c, w.desired) {
				log.Info("configuration file changed")
			}
			w.desired = c
		}
		cfg = w.desired
	}
	if _, err := w.n.Update(cfg, why); err == nil {
		w.rewatch()
	}
}

// rewatch watches the directories whose changes may change the
// inventory: those of the driver's files found, the usual library and
// binary directories, the driver root's /etc (ld.so.cache), the host's
// /proc/driver/nvidia and /dev, the CDI spec directories (emit: cdi,
// cdiImport), and the configuration file's directory (where a Kubernetes
// ConfigMap swaps a symbolic link). Directories that
// do not exist are skipped; the periodic rediscovery covers them.
func (w *Watcher) rewatch() {
	st := w.n.state.Load()
	cfg, snap := st.Config, st.Snapshot()
	mount := func(hostPath string) string {
		rel, err := filepath.Rel(cfg.DriverRoot, hostPath)
		if err != nil || strings.HasPrefix(rel, "..") {
			return ""
		}
		return filepath.Join(cfg.DriverRootMount, rel)
	}
	var dirs []string
	for _, f := range snap.Files {
		if p := mount(f.HostPath); p != "" {
			dirs = append(dirs, filepath.Dir(p))
		}
	}
	for _, d := range []string{"etc", "usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/bin", "usr/lib/firmware/nvidia", "lib/firmware/nvidia"} {
		dirs = append(dirs, filepath.Join(cfg.DriverRootMount, d))
	}
	dirs = append(dirs, filepath.Join(cfg.HostRoot, "proc/driver/nvidia"), filepath.Join(cfg.HostRoot, "dev"))
	if cfg.Emit == config.EmitCDI {
		dirs = append(dirs, underRoot(cfg.HostRoot, cfg.CDISpecDirs)...)
	}
	if cfg.CDIImport != nil {
		dirs = append(dirs, underRoot(cfg.HostRoot, cfg.CDIImport.SpecDirs)...)
	}
	if w.o.ConfigPath != "" {
		dirs = append(dirs, filepath.Dir(w.o.ConfigPath))
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	for _, d := range w.watched {
		if !slices.Contains(dirs, d) {
			if err := w.fsw.Remove(d); err != nil {
				w.n.log.WithError(err).Debugf("no longer watching %s", d)
			}
		}
	}
	w.watched = w.watched[:0]
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue
		}
		if err := w.fsw.Add(d); err != nil {
			w.n.log.WithError(err).Debugf("not watching %s", d)
			continue
		}
		w.watched = append(w.watched, d)
	}
}
