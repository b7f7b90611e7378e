// Package dra is nri-gpu's Dynamic Resource Allocation kubelet plugin
// (on with dra.enabled), built on the Kubernetes helper library
// k8s.io/dynamic-resource-allocation/kubeletplugin. It runs in nri-gpu
// run beside the NRI plugin and reads the same node.Node:
//
//   - it publishes one pool per node, named after the node: every usable
//     GPU and MIG device, under NVIDIA's device names, attributes and
//     capacities (so that selectors written for NVIDIA's DRA driver carry
//     over), again with every state that becomes current (rediscovery,
//     MIG layout change, health);
//   - PrepareResourceClaims answers each claim device with a CDI device
//     whose spec holds only its device nodes and an environment entry
//     naming the claim: no hooks, no driver files (the NRI side adds those
//     at CreateContainer from the live inventory);
//   - the kubelet's device health stream (WatchHealthStatus) reports the
//     same health as the slices' taints, which the kubelet puts in the
//     pods' allocatedResourcesStatus;
//   - the prepared claims are kept in a versioned checkpoint, and offered
//     to the request path as an immutable claims.Prepared (Prepared, and
//     Options.Book, which the NRI side's allocation table books them
//     through before they become current).
package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/socket"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/ops/kubeapi"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// NodeNameEnv is the environment variable the node's name is read from:
// the DaemonSet sets it from the downward API (spec.nodeName).
const NodeNameEnv = "NODE_NAME"

// maxSliceDevices is how many devices one ResourceSlice may hold
// (resource.k8s.io/v1's ResourceSliceMaxDevices).
const maxSliceDevices = resourceapi.ResourceSliceMaxDevices

// Options are the plugin's settings: the dra key's, with the node's name
// and the host's roots.
type Options struct {
	DriverName      string
	NodeName        string
	PluginDir       string
	RegistrationDir string
	CDIDir          string
	// DevRoot is the host's device directory as the runtime sees it
	// (devicePlugin.devRoot): CDI device nodes name their hostPath there.
	DevRoot string
	// SysRoot is where the host's /sys is read (hostRoot + /sys).
	SysRoot string
	// MPSRoot is devicePlugin.mpsRoot: where the MPS control daemons of
	// claims with sharing strategy MPS have their directories.
	MPSRoot string
	// Book, when set, is told every set of prepared claims before it
	// becomes current (the NRI side's allocation table books their
	// devices: plugin.Plugin.SetPrepared), with the UID of the claim
	// being prepared, if any: an error refuses that claim, and nothing
	// changes. At start and after an Unprepare it is told with no claim,
	// and its error is only logged.
	Book func(prepared *claims.Prepared, claim string) error
	// HealthResend is how often the devices' health is sent to the
	// kubelet unchanged; zero: DefaultHealthResend.
	HealthResend time.Duration
	// MIG makes MIG devices on demand on the GPUs of dra.dynamicMIG
	// (NVML); nil: they are not published.
	MIG nvml.MIGMaker
}

// publisher publishes ResourceSlices (the helper's PublishResources).
type publisher interface {
	PublishResources(ctx context.Context, r resourceslice.DriverResources) error
}

// Driver is the DRA kubelet plugin.
type Driver struct {
	opts     Options
	nodeName string
	node     *node.Node
	client   kubernetes.Interface
	log      *logrus.Entry

	// mu serializes Prepare, Unprepare and reading the state to publish;
	// guards ckpt, mpsStatus, pub and roots. Nothing holds it while
	// waiting for an MPS daemon or publishing to the API server (a
	// prepare may look up a stale claim under it: dropStale).
	mu sync.Mutex
	// pubMu orders publishing: one set of ResourceSlices at a time, the
	// last state last.
	pubMu sync.Mutex
	ckpt  checkpoint
	// files are the prepared claims' device metadata files; guarded by
	// mu.
	files claimFiles
	// prepared is ckpt as the request path reads it, swapped whole.
	prepared atomic.Pointer[claims.Prepared]
	// mpsStatus is the readiness of the prepared claims' MPS daemons, by
	// GPU UUID, as last read (probeMPS); guarded by mu.
	mpsStatus map[string]sharing.MPSStatus
	// noTaints is set once the API server dropped device taints (no
	// DRADeviceTaints): unhealthy devices are then left out instead.
	noTaints atomic.Bool
	// noShares is set once the API server dropped the fields of a device
	// shareable by memory (no DRAConsumableCapacity): such devices are
	// then published whole.
	noShares atomic.Bool
	// noPartitions is set once the API server dropped counter sets (no
	// DRAPartitionableDevices): GPUs of dra.dynamicMIG are then not
	// published at all (whole and MIG devices without counters would be
	// allocated together).
	noPartitions atomic.Bool
	// profiles caches each dynamic-MIG GPU's MIG profiles, by UUID
	// (migProfiles); guarded by mu.
	profiles map[string][]nvml.ProfilePlacements
	// sharesLogged is set once publishing said which GPUs it shares.
	sharesLogged atomic.Bool
	// pub is the helper once Serve started it; roots caches pcieRoot by
	// bus id.
	pub   publisher
	roots map[string]string
	// watchReady is how waitMPS is woken (the package's watchReady; the
	// handshake benchmark sets the polling it replaced).
	watchReady func(ctx context.Context, dirs ...string) <-chan struct{}
	// healthResend is Options.HealthResend.
	healthResend time.Duration
}

// New makes the plugin's directories, reads its checkpoint, and makes
// the CDI directory agree with it: a claim's missing spec is written
// again (a tmpfs CDI directory after a reboot), a spec of this driver
// that the checkpoint does not name is removed (a crash between the two
// writes). It serves nothing yet (Serve).
func New(opts Options, n *node.Node, client kubernetes.Interface, log *logrus.Logger) (*Driver, error) {
	if opts.NodeName == "" {
		return nil, fmt.Errorf("start DRA: the node's name is unknown: set the environment variable %s from the downward API (fieldRef spec.nodeName), as deploy/ does", NodeNameEnv)
	}
	// The library makes neither directory; the kubelet makes the
	// registration directory, but may start after nri-gpu.
	for _, dir := range []string{opts.PluginDir, opts.RegistrationDir, opts.CDIDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("start DRA: %w", err)
		}
	}
	if err := os.Chmod(opts.PluginDir, 0o750); err != nil {
		return nil, fmt.Errorf("start DRA: %w", err)
	}
	ckpt, err := readCheckpoint(opts.PluginDir)
	if err != nil {
		return nil, fmt.Errorf("start DRA: %w", err)
	}
	d := &Driver{opts: opts, nodeName: opts.NodeName, node: n, client: client, ckpt: ckpt,
		files: readAllMetadata(opts.PluginDir, ckpt),
		log:   log.WithField("component", "dra"), roots: map[string]string{}, watchReady: watchReady, healthResend: opts.HealthResend}
	d.install(d.ckpt, d.files)
	d.tell(d.prepared.Load())
	d.reconcileMetadata()
	if err := d.reconcilePartitions(); err != nil {
		return nil, fmt.Errorf("start DRA: %w", err)
	}
	if err := d.reconcileSpecs(); err != nil {
		return nil, fmt.Errorf("start DRA: %w", err)
	}
	return d, nil
}

// Prepared returns the node's prepared claims: the seam the request path
// reads at CreateContainer. Never nil.
func (d *Driver) Prepared() *claims.Prepared { return d.prepared.Load() }

// install makes c the checkpoint, files its claims' metadata files, and
// its devices what Prepared returns.
// The caller holds mu (or is New).
func (d *Driver) install(c checkpoint, files claimFiles) {
	d.ckpt, d.files = c, files
	p, _ := withStatus(c.prepared(files), d.mpsStatus)
	d.prepared.Store(p)
}

// tell tells Book of the prepared claims p, with no claim being prepared
// (start, Unprepare); an error, which only a claim being prepared can
// have, is logged.
func (d *Driver) tell(p *claims.Prepared) {
	if d.opts.Book == nil {
		return
	}
	if err := d.opts.Book(p, ""); err != nil {
		d.log.WithError(err).Warn("DRA: booking the prepared claims")
	}
}

// reconcileSpecs makes the CDI directory agree with the checkpoint: a
// spec of no prepared claim goes, a prepared claim's missing spec is
// written again, and the spec of a claim whose devices' names or nodes
// are other GPUs now (identityMismatch) goes.
func (d *Driver) reconcileSpecs() error {
	have, err := ownSpecs(d.opts.CDIDir, d.opts.DriverName)
	if err != nil {
		return err
	}
	for _, uid := range have {
		if _, ok := d.ckpt.Claims[uid]; !ok {
			d.log.WithField("uid", uid).Info("DRA: removing the CDI spec of a claim that is not prepared")
			if err := removeSpec(d.opts.CDIDir, d.opts.DriverName, uid); err != nil {
				return err
			}
		}
	}
	st := d.node.State()
	nodes, byName := nodesOf(st), map[string]unit{}
	for _, u := range units(st) {
		byName[u.name] = u
	}
	for uid, cc := range d.ckpt.Claims {
		if why, replaced := identityMismatch(cc, byName); replaced {
			// Its devices' nodes are other GPUs now: a container of the
			// claim that the kubelet restarts from its cache must not get
			// them. The record stays until the kubelet asks again.
			d.log.WithFields(logrus.Fields{"claim": cc.Namespace + "/" + cc.Name, "uid": uid}).Warnf("DRA: removing the CDI spec of a prepared claim whose devices changed: %s", why)
			if err := removeSpec(d.opts.CDIDir, d.opts.DriverName, uid); err != nil {
				return err
			}
			continue
		}
		if slices.Contains(have, uid) {
			continue
		}
		if err := d.writeClaimSpec(uid, cc.devices(uid), nodes); err != nil {
			d.log.WithField("uid", uid).WithError(err).Warn("DRA: the CDI spec of a prepared claim cannot be written again")
		}
	}
	return nil
}

// Serve registers the plugin with the kubelet, publishes the node's
// ResourceSlices and follows the node's states until ctx ends; then it
// unregisters (the helper removes its sockets). The ResourceSlices stay:
// a restarted nri-gpu takes them over.
func (d *Driver) Serve(ctx context.Context) error {
	ctx = klog.NewContext(ctx, kubeapi.Logger(d.log))
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(d.opts.DriverName),
		kubeletplugin.NodeName(d.nodeName),
		kubeletplugin.KubeClient(d.client),
		kubeletplugin.PluginDataDirectoryPath(d.opts.PluginDir),
		kubeletplugin.RegistrarDirectoryPath(d.opts.RegistrationDir),
		// Sockets an older nri-gpu pod's exit does not remove once this
		// one has replaced them (package socket): the helper's own
		// listeners remove their paths whoever owns them by then.
		kubeletplugin.PluginListener(socket.Listen),
		kubeletplugin.RegistrarListener(socket.Listen),
		// The kubelet's DRAResourceHealth service, v1 and v1alpha1
		// (WatchHealthStatus).
		kubeletplugin.HealthService(true),
		// Prepare and Unprepare serialize on mu themselves, and a
		// prepare waiting for an MPS daemon holds no lock: the helper's
		// serialization would hold every other claim for that wait.
		kubeletplugin.Serialize(false),
	)
	if err != nil {
		return fmt.Errorf("start DRA kubelet plugin: %w", err)
	}
	defer helper.Stop()
	d.mu.Lock()
	d.pub = helper
	d.mu.Unlock()
	states := make(chan struct{}, 1)
	cancel := d.node.Subscribe(func(*node.State) {
		select {
		case states <- struct{}{}:
		default:
		}
	})
	defer cancel()
	d.log.WithFields(logrus.Fields{"driver": d.opts.DriverName, "node": d.nodeName, "socket": filepath.Join(d.opts.PluginDir, "dra.sock")}).Info("DRA kubelet plugin serving")
	d.publish(ctx)
	go d.followMPS(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-states:
			d.publish(ctx)
		}
	}
}

// publish publishes the current state's devices. The API call holds
// pubMu, not mu: a prepare never waits for publishing.
func (d *Driver) publish(ctx context.Context) {
	d.pubMu.Lock()
	defer d.pubMu.Unlock()
	d.mu.Lock()
	pub := d.pub
	var res resourceslice.DriverResources
	if pub != nil {
		res = d.resources(d.node.State())
	}
	d.mu.Unlock()
	if pub == nil {
		return
	}
	if err := pub.PublishResources(ctx, res); err != nil {
		d.log.WithError(err).Error("DRA: publishing ResourceSlices")
	}
}

// resources returns st's devices as the driver's resources: one pool
// named after the node, in slices of at most 128 devices. An unhealthy
// device carries NVIDIA's taint or, where the API server has no device
// taints, is left out. The caller holds mu.
func (d *Driver) resources(st *node.State) resourceslice.DriverResources {
	var devs []resourceapi.Device
	var shared []string
	sets, parts := d.partitionsOf(st)
	dynamic := map[string]bool{}
	for _, g := range dynamicGPUs(st) {
		dynamic[g.UUID] = true
	}
	if st != nil {
		snap := st.Snapshot()
		for _, u := range units(st) {
			if u.gpu.MIG != nil && dynamic[u.parent.UUID] {
				continue // made on demand: published as its placement, or not at all
			}
			if _, ok := parts[u.gpu.UUID]; ok && u.gpu.MIG == nil {
				continue // out of MIG mode: published whole among its partitions
			}
			taints := taintsFor(st.Unhealthy[u.gpu.UUID])
			if taints != nil && d.noTaints.Load() {
				continue
			}
			dv := sliceDevice(u, snap, d.pcieRoot, taints)
			if shareable(st.Config, u) && !d.noShares.Load() {
				makeShareable(&dv, st.Config.DRA.MemoryShares.MinimumBytes())
				shared = append(shared, u.name)
			}
			devs = append(devs, dv)
		}
	}
	if len(shared) > 0 && !d.sharesLogged.Swap(true) {
		d.log.WithField("devices", shared).Info("DRA: publishing GPUs shareable by memory (dra.memoryShares: allowMultipleAllocations, " +
			"memory request policy defaulting to the whole GPU); an API server without " + ConsumableCapacityGate + " drops them, and they are published whole")
	}
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{}}}}
	if len(devs) > 0 || len(sets) > 0 {
		pool.Slices = partitionSlices(sets, parts)
		for len(devs) > 0 {
			n := min(len(devs), maxSliceDevices)
			pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: devs[:n]})
			devs = devs[n:]
		}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{d.nodeName: pool}}
}

// NodeResources returns what a driver on node nodeName publishes for the
// node state st (its ResourceSlices' pools and devices, through
// resources), sysRoot's sysfs naming the PCIe roots ("": none), on an API
// server with device taints and consumable capacity. It is the seam a
// bench publishes many simulated nodes' slices through, each without a
// kubelet plugin; log gets what publishing logs.
func NodeResources(st *node.State, nodeName, sysRoot string, log *logrus.Logger) resourceslice.DriverResources {
	d := &Driver{opts: Options{NodeName: nodeName, SysRoot: sysRoot}, nodeName: nodeName,
		log: log.WithField("component", "dra"), roots: map[string]string{}}
	return d.resources(st)
}

// pcieRoot is the GPU's PCIe root complex from the host's sysfs, read
// once per bus id; "" when sysfs does not say. The caller holds mu.
func (d *Driver) pcieRoot(bus string) string {
	if r, ok := d.roots[bus]; ok {
		return r
	}
	r := ""
	if d.opts.SysRoot != "" {
		if a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bus, deviceattribute.WithFSFromRoot(d.opts.SysRoot)); err == nil && a.Value.StringValue != nil {
			r = *a.Value.StringValue
		}
	}
	d.roots[bus] = r
	return r
}

// HandleError implements kubeletplugin.DRAPlugin: errors of the
// background work (publishing). An API server that dropped the devices'
// taints has no DRADeviceTaints: unhealthy devices are then left out of
// the slices instead, and published again.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		known := false
		if slices.Contains(dropped.DisabledFeatures(), "DRADeviceTaints") {
			known = true
			if !d.noTaints.Swap(true) {
				d.log.Info("DRA: the API server has no device taints (DRADeviceTaints): unhealthy devices are left out of the ResourceSlices")
				go d.publish(ctx)
			}
		}
		if slices.Contains(dropped.DisabledFeatures(), PartitionableGate) {
			known = true
			if !d.noPartitions.Swap(true) {
				d.log.Warn("DRA: the API server has no partitionable devices (feature gate " + PartitionableGate + ", beta and on by default in Kubernetes 1.37, " +
					"alpha and off in 1.34): the GPUs of dra.dynamicMIG are not published")
				go d.publish(ctx)
			}
		}
		if slices.Contains(dropped.DisabledFeatures(), ConsumableCapacityGate) {
			known = true
			if !d.noShares.Swap(true) {
				d.log.Warn("DRA: the API server has no consumable capacity (feature gate " + ConsumableCapacityGate + ", beta and on by default from Kubernetes 1.36, " +
					"alpha and off in 1.34): the GPUs of dra.memoryShares are published whole, without allowMultipleAllocations; a claim gets a whole GPU")
				go d.publish(ctx)
			}
		}
		if known {
			return
		}
	}
	d.log.WithError(err).Errorf("DRA: %s", msg)
}
