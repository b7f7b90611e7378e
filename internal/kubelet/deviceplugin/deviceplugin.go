// Package deviceplugin is nri-gpu's kubelet device plugin (API v1beta1):
// it advertises the node's GPUs to the kubelet as an extended resource
// (nvidia.com/gpu by default), so that the scheduler counts them, and
// answers the kubelet's Allocate with the GPUs' device nodes and an
// annotation naming them. It injects nothing else: the driver's files and
// environment come from the NRI side when the container is created.
//
// The plugin serves its own unix socket in the kubelet's device plugin
// directory and registers with the kubelet's Registration service there
// (kubelet.sock); it serves again and registers again when the kubelet
// restarts (the kubelet empties the directory and makes its socket anew)
// and when nri-gpu restarts. Its devices follow the node's state
// (node.Node.Subscribe): one device per GPU, Healthy while discovery sees
// it, Unhealthy once a rediscovery no longer does or the driver is gone.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/socket"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Defaults of Options, as the configuration's devicePlugin key has them.
const (
	DefaultResourceName = "nvidia.com/gpu"
	// DefaultSocketDir is where the kubelet serves its Registration
	// service (kubelet.sock) and looks for device plugins' sockets.
	DefaultSocketDir = "/var/lib/kubelet/device-plugins"
	// KubeletSocket is the name of the kubelet's socket in the socket
	// directory.
	KubeletSocket = config.KubeletSocketName
)

// AllocationAnnotation is the annotation Allocate puts on each container
// the kubelet gives devices of resource: the devices' IDs (UUIDs),
// comma-separated, under a key of the resource's own
// (alloc.KubeletAnnotationFor), since the kubelet keeps only the first
// value of a key when it merges the answers of a container's resources.
// The kubelet passes it in the CRI container config, which runtimes hand
// to NRI plugins as the container's annotations; a pod author cannot set
// it there. The NRI side trusts the union of a container's such
// annotations only together with the devices' nodes, which the kubelet
// adds from Allocate's device specs and a non-privileged pod cannot add
// itself (docs/design.md, "The kubelet device plugin").
func AllocationAnnotation(resource string) string { return alloc.KubeletAnnotationFor(resource) }

// registerTimeout bounds one Register call to the kubelet; retryInterval
// is how long a failed registration waits before the next try (a kubelet
// restart that recreates its socket triggers one sooner).
const (
	registerTimeout = 10 * time.Second
	retryInterval   = 5 * time.Second
	// settleTime is the quiet time after a change in the socket
	// directory before registering.
	settleTime = 100 * time.Millisecond
)

// Options say what the plugin advertises and where.
type Options struct {
	// ResourceName is the extended resource the GPUs are advertised as;
	// default DefaultResourceName.
	ResourceName string
	// SocketDir is the kubelet's device plugin directory; default
	// DefaultSocketDir.
	SocketDir string
	// DevRoot is the host's device directory as the kubelet and the
	// runtime see it (devicePlugin.devRoot); default /dev. Allocate
	// names a GPU's node /dev/<name> in the container and
	// DevRoot/<name> on the host: a simulated node keeps its devfs
	// elsewhere.
	DevRoot string
	// Config, when set, is the device plugin configuration the resource
	// comes from: the plugin then advertises the devices that the
	// node's sharing plan (node.State.Shares, or for a state without
	// one the plan of Config) gives ResourceName, each whole or as its
	// replicas. Resources sets it.
	Config *config.DevicePlugin
	// Select, without Config, picks the node's devices (GPUs, MIG
	// devices) this resource advertises, each whole; nil advertises
	// every one.
	Select func(inventory.GPU) bool
}

// Plugin is the device plugin of one node. Its exported RPC methods are
// the v1beta1 DevicePlugin service, called by the kubelet.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	node *node.Node
	o    Options
	log  *logrus.Entry
	// socket is the plugin's own socket, in o.SocketDir.
	socket string

	devices *devices

	// server and sockInfo are the gRPC server serving socket and the
	// socket file it made; owned by Run's goroutine.
	server   *grpc.Server
	sockInfo os.FileInfo
}

// New returns the device plugin of n. It serves nothing until Run.
func New(n *node.Node, o Options, log *logrus.Logger) *Plugin {
	if o.ResourceName == "" {
		o.ResourceName = DefaultResourceName
	}
	if o.SocketDir == "" {
		o.SocketDir = DefaultSocketDir
	}
	if o.DevRoot == "" {
		o.DevRoot = config.DefaultDevRoot
	}
	return &Plugin{
		node:    n,
		o:       o,
		log:     log.WithFields(logrus.Fields{"component": "device plugin", "resource": o.ResourceName}),
		socket:  filepath.Join(o.SocketDir, SocketName(o.ResourceName)),
		devices: newDevices(log.WithFields(logrus.Fields{"component": "device plugin", "resource": o.ResourceName}), o),
	}
}

// SocketName is the file name of the plugin's socket for a resource:
// nri-gpu-<resource, with / as ->.sock.
func SocketName(resource string) string {
	return config.DevicePluginSocketName(resource)
}

// Socket returns the path of the plugin's socket.
func (p *Plugin) Socket() string { return p.socket }

// Run serves the plugin's socket and registers with the kubelet until ctx
// is cancelled; then it stops serving and removes its socket. A kubelet
// that is not there yet, or refuses the registration, is retried: when
// its socket appears and every few seconds. Run fails only when the
// socket directory cannot be watched or the plugin's socket cannot be
// served. It is one piece on purpose: one loop over the directory's
// events, the retry timer and the node's changes, whose state (serving,
// registered, when to retry) lives in its local variables.
func (p *Plugin) Run(ctx context.Context) error {
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("device plugin: watching the kubelet's socket directory: %w", err)
	}
	defer fsw.Close()
	if err := fsw.Add(p.o.SocketDir); err != nil {
		return fmt.Errorf("device plugin: key devicePlugin.socketDir: watching %s (the kubelet makes it at start): %w", p.o.SocketDir, err)
	}
	cancel := p.node.Subscribe(p.devices.update)
	defer cancel()
	if st := p.node.State(); st != nil {
		p.devices.update(st)
	}
	if err := p.serve(); err != nil {
		return err
	}
	defer p.stop()

	// A kubelet that restarts removes the plugin's socket, then makes its
	// own: both events ask for a registration, which waits for a short
	// quiet time (settle) so that one registration answers both.
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	pending, warned := true, false
	register := func() {
		if !pending {
			return
		}
		if err := p.register(ctx); err != nil {
			// Warned once until a registration succeeds.
			e := p.log.WithError(err)
			if warned {
				e.Debugf("not registered with the kubelet; retrying in %s", retryInterval)
			} else {
				e.Warnf("not registered with the kubelet; retrying every %s and when %s appears", retryInterval, KubeletSocket)
			}
			warned = true
			settle.Reset(retryInterval)
			return
		}
		pending, warned = false, false
	}
	register()
	// check: the socket's file changed; at the next settle, keepServing
	// finds out whether the kubelet removed it or a newer nri-gpu
	// replaced it. ceded: a newer nri-gpu serves the kubelet now.
	check, ceded := false, false
	for {
		select {
		case <-ctx.Done():
			p.log.Info("stopping: the kubelet will see the resource's devices go")
			return nil
		case ev, ok := <-fsw.Events:
			if !ok {
				return nil
			}
			switch {
			case ceded:
			case ev.Name == p.socket && ev.Has(fsnotify.Remove|fsnotify.Rename):
				// The kubelet empties the directory when it starts; a newer
				// nri-gpu removes the socket and makes its own.
				check = true
				settle.Reset(settleTime)
			case ev.Name == filepath.Join(p.o.SocketDir, KubeletSocket) && ev.Has(fsnotify.Create):
				p.log.Info("the kubelet's socket was created (kubelet restart): registering again")
				check, pending = true, true
				settle.Reset(settleTime)
			}
		case err, ok := <-fsw.Errors:
			if !ok {
				return nil
			}
			p.log.WithError(err).Warn("watching the kubelet's socket directory")
		case <-settle.C:
			if check && !ceded {
				check = false
				serving, restarted, err := p.keepServing()
				if err != nil {
					return err
				}
				ceded, pending = !serving, pending || restarted
			}
			if !ceded {
				register()
			}
		}
	}
}

// keepServing settles who serves the plugin's socket after its file
// changed. Still the file serve made: nothing to do. Gone (the kubelet
// empties the directory when it starts): serve it again (restarted).
// Another file (a newer nri-gpu of this node replaced it: an overlapping
// reinstall): stop serving and leave it, not serving is false; taking it
// back would start the two taking it from each other, and the kubelet
// talks to the newer one anyway.
func (p *Plugin) keepServing() (serving, restarted bool, err error) {
	fi, err := os.Stat(p.socket)
	switch {
	case err == nil && socket.Same(fi, p.sockInfo):
		return true, false, nil
	case err == nil:
		p.log.Warnf("another nri-gpu replaced the socket %s and serves the kubelet: this one stops serving it", p.socket)
		p.stop()
		return false, false, nil
	case errors.Is(err, fs.ErrNotExist):
		p.log.Info("socket removed (kubelet restart?): serving it again")
		p.stop()
		return true, true, p.serve()
	default:
		return false, false, fmt.Errorf("device plugin: %w", err)
	}
}

// serve listens on the plugin's socket, replacing a socket left by an
// earlier nri-gpu, and serves the DevicePlugin service there.
func (p *Plugin) serve() error {
	l, err := socket.Listen(context.Background(), p.socket)
	if err != nil {
		return fmt.Errorf("device plugin: serving %s (key devicePlugin.socketDir): %w", p.socket, err)
	}
	fi, err := os.Stat(p.socket)
	if err != nil {
		l.Close()
		return fmt.Errorf("device plugin: %w", err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, p)
	p.server, p.sockInfo = s, fi
	go func() {
		if err := s.Serve(l); err != nil {
			p.log.WithError(err).Error("serving the kubelet stopped")
		}
	}()
	return nil
}

// stop stops serving, ending the kubelet's streams; the listener removes
// the socket if it is still the one serve made (another nri-gpu may have
// replaced it: package socket).
func (p *Plugin) stop() {
	if p.server == nil {
		return
	}
	p.server.Stop()
	p.server = nil
}

// register registers the plugin with the kubelet's Registration service.
func (p *Plugin) register(ctx context.Context) error {
	kubelet := filepath.Join(p.o.SocketDir, KubeletSocket)
	conn, err := grpc.NewClient("unix:"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to the kubelet at %s: %w", kubelet, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.o.ResourceName,
		Options:      pluginOptions(),
	})
	if err != nil {
		return fmt.Errorf("registering with the kubelet at %s: %w", kubelet, err)
	}
	n, healthy := p.devices.count()
	p.log.WithFields(logrus.Fields{"socket": p.socket, "devices": n, "healthy": healthy}).Info("registered with the kubelet")
	return nil
}

func pluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions says that the plugin ranks allocations and needs
// no PreStartContainer call.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return pluginOptions(), nil
}

// ListAndWatch sends the node's devices, then again at each change of
// their list or health, until the kubelet goes or the plugin stops.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		list, changed := p.devices.current()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: list}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-s.Context().Done():
			return nil
		}
	}
}

// PreStartContainer is not needed (GetDevicePluginOptions says so).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
