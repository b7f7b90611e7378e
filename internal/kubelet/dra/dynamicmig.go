package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// MIG devices made on demand: a claim allocated a placement of a GPU of
// dra.dynamicMIG gets its GPU and compute instance created through NVML
// when it is prepared, recorded in the ledger (MadeFile) at once, before
// the claim's checkpoint record and CDI spec; its /dev/nvidia-caps nodes
// made as nvidia-modprobe makes them; the node rediscovered, so that the
// MIG device is a unit like any other. At unprepare the instances go. At
// start (New), an instance on such a GPU that the ledger does not name (a
// crash between creating and recording), and one the ledger names for a
// claim the checkpoint does not have (a crash before the claim was
// recorded, or after it was released), is destroyed. A destroyed
// device's nvidia-caps nodes are removed.

// MadeFile is the ledger, in dra.pluginDir, of the MIG devices made on
// demand.
const MadeFile = "dynamic-mig.json"

// madeMIG is one MIG device made on demand, and the claim it is for.
type madeMIG struct {
	GPU       string `json:"gpu"` // the GPU's UUID
	GI        int    `json:"gi"`
	CI        int    `json:"ci"`
	ProfileID int    `json:"profileID"`
	Start     int    `json:"start"`
	Size      int    `json:"size"`
	UUID      string `json:"uuid"`
	Claim     string `json:"claim"` // UID
}

// ledger is MadeFile's content.
type ledger struct {
	Made []madeMIG `json:"made"`
}

// CountMade reads the ledger in dir (none is an empty one) and returns
// how many MIG devices made on demand it names: what nri-gpu doctor
// checks.
func CountMade(dir string) (int, error) {
	l, err := readLedger(dir)
	return len(l.Made), err
}

func readLedger(dir string) (ledger, error) {
	var l ledger
	data, err := os.ReadFile(filepath.Join(dir, MadeFile))
	if errors.Is(err, fs.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return l, err
	}
	if err := json.Unmarshal(data, &l); err != nil {
		return l, fmt.Errorf("read %s: %w", filepath.Join(dir, MadeFile), err)
	}
	return l, nil
}

func (l ledger) write(dir string) error {
	data, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, MadeFile), append(data, '\n'), 0o600)
}

// without returns l without the entries drop says.
func (l ledger) without(drop func(madeMIG) bool) ledger {
	var out ledger
	for _, m := range l.Made {
		if !drop(m) {
			out.Made = append(out.Made, m)
		}
	}
	return out
}

// wantedPartition is a placement a claim was allocated on a dynamic GPU.
type wantedPartition struct {
	gpu       inventory.GPU
	name      string
	profileID int
	place     nvml.Range
}

// wantedPartitions returns the devices of c's allocation (this driver,
// this pool) that are placements of st's dynamic GPUs and do not exist.
// The caller holds mu.
func (d *Driver) wantedPartitions(c *resourceapi.ResourceClaim, st *node.State, byName map[string]unit) []wantedPartition {
	if c.Status.Allocation == nil {
		return nil
	}
	gpus := dynamicGPUs(st)
	var out []wantedPartition
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.opts.DriverName || r.Pool != d.nodeName {
			continue
		}
		if _, ok := byName[r.Device]; ok {
			continue
		}
		m := partitionNameRE.FindStringSubmatch(r.Device)
		if m == nil {
			continue
		}
		minor, _ := strconv.Atoi(m[1])
		id, _ := strconv.Atoi(m[2])
		start, _ := strconv.Atoi(m[3])
		for _, g := range gpus {
			if g.Minor != minor {
				continue
			}
			for _, p := range d.migProfiles(g.UUID) {
				for _, pl := range p.Placements {
					if p.ID == id && pl.Start == start && partitionName(g, p.Name, p.ID, pl.Start) == r.Device {
						out = append(out, wantedPartition{gpu: g, name: r.Device, profileID: id, place: pl})
					}
				}
			}
		}
	}
	return out
}

// wholeDynamic returns the dynamic GPUs (dynamicGPUs of st) that c's
// allocation (this driver, this pool) holds whole.
func (d *Driver) wholeDynamic(c *resourceapi.ResourceClaim, st *node.State) []inventory.GPU {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []inventory.GPU
	for _, g := range dynamicGPUs(st) {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == d.opts.DriverName && r.Pool == d.nodeName && r.Device == deviceName(g, g) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// makePartitions readies the dynamic GPUs c was allocated: a GPU claimed
// whole leaves MIG mode (the counters keep MIG devices off it, so none
// is there); for each MIG device c was allocated that does not exist,
// its GPU enters MIG mode if it is out, and the device is created,
// recorded in the ledger as soon as it exists, given its device nodes;
// then the node is rediscovered. It returns the node's state then, and
// how to undo it all (the claim is not prepared after all). On an error,
// what it made is destroyed. The caller holds mu.
func (d *Driver) makePartitions(c *resourceapi.ResourceClaim, st *node.State, byName map[string]unit) (*node.State, func(), error) {
	whole := d.wholeDynamic(c, st)
	want := d.wantedPartitions(c, st, byName)
	if len(whole) == 0 && len(want) == 0 {
		return st, func() {}, nil
	}
	if d.opts.MIG == nil {
		return nil, nil, fmt.Errorf("prepare claim %s/%s: its devices are of dra.dynamicMIG, and NVML cannot make MIG devices or switch MIG mode on this node", c.Namespace, c.Name)
	}
	switched := false
	for _, g := range whole {
		if !g.MIGEnabled {
			continue
		}
		if !migToggles(g) {
			return nil, nil, fmt.Errorf("prepare claim %s/%s: device %s is a GPU of dra.dynamicMIG in MIG mode, of architecture %q, which leaves MIG mode only with a GPU reset: "+
				"nri-gpu does not publish such a GPU whole; claim one of its MIG devices", c.Namespace, c.Name, deviceName(g, g), archOf(g))
		}
		if err := d.migModeOff(g); err != nil {
			return nil, nil, fmt.Errorf("prepare claim %s/%s: device %s: %w", c.Namespace, c.Name, deviceName(g, g), err)
		}
		switched = true
	}
	if len(want) > 0 {
		return d.makeWanted(c, st, want)
	}
	if !switched {
		return st, func() {}, nil
	}
	if _, err := d.node.Update(st.Config, "GPUs claimed whole left MIG mode for claim "+c.Namespace+"/"+c.Name); err != nil {
		return nil, nil, fmt.Errorf("prepare claim %s/%s: rediscovering the node after its GPUs left MIG mode: %w", c.Namespace, c.Name, err)
	}
	return d.node.State(), func() {}, nil
}

// makeWanted makes the MIG devices want of claim c (makePartitions):
// MIG mode on where it is off, each device created and recorded, the
// node rediscovered, the devices' nodes made. The caller holds mu.
func (d *Driver) makeWanted(c *resourceapi.ResourceClaim, st *node.State, want []wantedPartition) (*node.State, func(), error) {
	var made []madeMIG
	gpus := map[string]bool{}
	for _, w := range want {
		gpus[w.gpu.UUID] = true
	}
	undo := func() {
		d.log.WithFields(logrus.Fields{"claim": c.Namespace + "/" + c.Name, "made": len(made)}).Info("DRA: destroying the MIG devices made for a claim not prepared")
		now := d.node.State()
		for _, m := range made {
			d.destroyMade(now, m.GPU, m.GI, m.CI, m.UUID)
		}
		mine := map[madeMIG]bool{}
		for _, m := range made {
			mine[m] = true
		}
		if l, err := readLedger(d.opts.PluginDir); err == nil {
			_ = l.without(func(m madeMIG) bool { return mine[m] }).write(d.opts.PluginDir)
		}
		d.settleMIGMode(gpus)
		if _, err := d.node.Update(st.Config, "MIG devices of a claim not prepared destroyed"); err != nil {
			d.log.WithError(err).Warn("DRA: rediscovering the node")
		}
	}
	on := map[string]bool{}
	for _, w := range want {
		if w.gpu.MIGEnabled || on[w.gpu.UUID] {
			continue
		}
		if err := d.opts.MIG.SetMIGMode(w.gpu.UUID, true); err != nil {
			undo()
			return nil, nil, fmt.Errorf("prepare claim %s/%s: making MIG device %s: switching GPU %s to MIG mode: %w", c.Namespace, c.Name, w.name, w.gpu.UUID, err)
		}
		on[w.gpu.UUID] = true
		d.log.WithFields(logrus.Fields{"gpu": w.gpu.UUID, "claim": c.Namespace + "/" + c.Name}).Info("DRA: GPU of dra.dynamicMIG switched to MIG mode for its first MIG device")
	}
	for _, w := range want {
		inst, err := d.opts.MIG.CreateMIG(w.gpu.UUID, w.profileID, w.place)
		if err != nil {
			undo()
			return nil, nil, fmt.Errorf("prepare claim %s/%s: making MIG device %s: %w", c.Namespace, c.Name, w.name, err)
		}
		m := madeMIG{GPU: w.gpu.UUID, GI: inst.GI, CI: inst.CI, ProfileID: w.profileID, Start: w.place.Start, Size: w.place.Size, UUID: inst.UUID, Claim: string(c.UID)}
		made = append(made, m)
		l, err := readLedger(d.opts.PluginDir)
		if err == nil {
			l.Made = append(l.Made, m)
			err = l.write(d.opts.PluginDir)
		}
		if err != nil {
			undo()
			return nil, nil, fmt.Errorf("prepare claim %s/%s: recording MIG device %s: %w", c.Namespace, c.Name, w.name, err)
		}
	}
	if _, err := d.node.Update(st.Config, "MIG devices made for claim "+c.Namespace+"/"+c.Name); err != nil {
		undo()
		return nil, nil, fmt.Errorf("prepare claim %s/%s: rediscovering the node after making its MIG devices: %w", c.Namespace, c.Name, err)
	}
	st = d.node.State()
	for _, m := range made {
		if err := capsNodes(st.Config.HostRoot, st.Snapshot(), m.UUID); err != nil {
			undo()
			return nil, nil, fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
		}
	}
	d.log.WithFields(logrus.Fields{"claim": c.Namespace + "/" + c.Name, "made": len(made)}).Info("DRA: MIG devices made on demand")
	return st, undo, nil
}

// archOf is g's architecture as NVML names it, "unknown" without one.
func archOf(g inventory.GPU) string {
	if g.Props == nil || g.Props.Architecture == "" {
		return "unknown"
	}
	return g.Props.Architecture
}

// migModeOff takes GPU g out of MIG mode for a claim of it whole: none
// of its MIG devices may exist (the scheduler's counters keep claims of
// them off a GPU claimed whole; one there is a claim not yet
// unprepared). The caller holds mu.
func (d *Driver) migModeOff(g inventory.GPU) error {
	insts, err := d.opts.MIG.Instances(g.UUID)
	if err != nil {
		return fmt.Errorf("listing the MIG devices of GPU %s: %w", g.UUID, err)
	}
	if len(insts) > 0 {
		var ids []string
		for _, in := range insts {
			ids = append(ids, fmt.Sprintf("GPU instance %d", in.GI))
		}
		return fmt.Errorf("GPU %s still has %d MIG devices (%s): it leaves MIG mode, and is prepared whole, once the claims holding them are unprepared", g.UUID, len(insts), strings.Join(ids, ", "))
	}
	if err := d.opts.MIG.SetMIGMode(g.UUID, false); err != nil {
		return fmt.Errorf("switching GPU %s out of MIG mode: %w", g.UUID, err)
	}
	d.log.WithField("gpu", g.UUID).Info("DRA: GPU of dra.dynamicMIG switched out of MIG mode for a claim of it whole")
	return nil
}

// settleMIGMode takes the dynamic GPUs named in uuids whose MIG mode
// toggles (migToggles) out of MIG mode when no MIG device is left on
// them, as NVIDIA's DRA driver does after a GPU's last MIG device; it
// reports whether one left. A failure is logged and leaves the GPU in MIG
// mode, which a claim of it whole tries again. The caller holds mu.
func (d *Driver) settleMIGMode(uuids map[string]bool) bool {
	if d.opts.MIG == nil {
		return false
	}
	left := false
	for _, g := range dynamicGPUs(d.node.State()) {
		if !uuids[g.UUID] || !migToggles(g) {
			continue
		}
		insts, err := d.opts.MIG.Instances(g.UUID)
		if err != nil || len(insts) > 0 {
			if err != nil {
				d.log.WithField("gpu", g.UUID).WithError(err).Warn("DRA: dra.dynamicMIG: the GPU's MIG devices cannot be listed; it stays in MIG mode")
			}
			continue
		}
		if err := d.opts.MIG.SetMIGMode(g.UUID, false); err != nil {
			d.log.WithField("gpu", g.UUID).WithError(err).Warn("DRA: dra.dynamicMIG: the GPU has no MIG device left and cannot leave MIG mode; a claim of it whole tries again")
			continue
		}
		if g.MIGEnabled {
			left = true
			d.log.WithField("gpu", g.UUID).Info("DRA: GPU of dra.dynamicMIG switched out of MIG mode: its last MIG device is gone")
		}
	}
	return left
}

// destroyMade destroys the MIG device made on demand uuid (GPU instance
// gi and compute instance ci of GPU gpu) and removes its nvidia-caps
// nodes, as st has them; it reports whether its instances are gone. A
// failure is logged. The caller holds mu.
func (d *Driver) destroyMade(st *node.State, gpu string, gi, ci int, uuid string) bool {
	if err := d.opts.MIG.DestroyMIG(gpu, gi, ci); err != nil {
		d.log.WithError(err).WithFields(logrus.Fields{"gpu": gpu, "gi": gi, "ci": ci, "uuid": uuid}).Warn("DRA: dra.dynamicMIG: a MIG device made on demand cannot be destroyed")
		return false
	}
	if err := removeCapsNodes(st.Config.HostRoot, st.Snapshot(), uuid); err != nil {
		d.log.WithError(err).Warn("DRA: removing the nvidia-caps nodes of a MIG device destroyed")
	}
	return true
}

// adoptPartitions makes claim uid the holder, in the ledger, of the MIG
// devices made on demand among devs (a device made for a claim that was
// released without an unprepare, which the scheduler gave to this one).
// The caller holds mu.
func (d *Driver) adoptPartitions(uid string, uuids []string) {
	l, err := readLedger(d.opts.PluginDir)
	if err != nil || len(l.Made) == 0 {
		return
	}
	changed := false
	for i, m := range l.Made {
		if m.Claim != uid && slices.Contains(uuids, m.UUID) {
			l.Made[i].Claim = uid
			changed = true
		}
	}
	if changed {
		if err := l.write(d.opts.PluginDir); err != nil {
			d.log.WithError(err).Warn("DRA: writing the ledger of MIG devices made on demand")
		}
	}
}

// capsNodes makes the nvidia-caps device nodes of MIG device uuid on the
// host (under hostRoot), as nvidia-modprobe -f does for a capability
// file: /dev/nvidia-caps (0755) and nvidia-cap<minor>, a character device
// of the nvidia-caps major, mode 0444 (the capability file's
// DeviceFileMode). A node already there is kept. This is the one place
// the DRA driver writes under /dev: the runtime passes a CDI device node
// on from the host's.
func capsNodes(hostRoot string, snap *inventory.Snapshot, uuid string) error {
	for _, m := range snap.MIG {
		if m.UUID != uuid {
			continue
		}
		for _, n := range []inventory.DeviceNode{m.GINode, m.CINode} {
			if n.Path == "" {
				return fmt.Errorf("MIG device %s has no nvidia-caps node", uuid)
			}
			p := filepath.Join(hostRoot, n.Path)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return fmt.Errorf("MIG device %s: %w", uuid, err)
			}
			if err := unix.Mknod(p, unix.S_IFCHR|0o444, int(unix.Mkdev(uint32(n.Major), uint32(n.Minor)))); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("MIG device %s: mknod %s: %w", uuid, p, err)
			}
		}
		return nil
	}
	return fmt.Errorf("MIG device %s was made but discovery does not see it", uuid)
}

// removeCapsNodes removes the nvidia-caps nodes of MIG device uuid (as
// snap has it) from the host, once its instances are destroyed: a node
// is only a name, but one left behind is a node no MIG device has (what
// nvidia-smi leaves too). A node that is gone already is no error.
func removeCapsNodes(hostRoot string, snap *inventory.Snapshot, uuid string) error {
	for _, m := range snap.MIG {
		if m.UUID != uuid {
			continue
		}
		for _, n := range []inventory.DeviceNode{m.CINode, m.GINode} {
			if n.Path == "" {
				continue
			}
			if err := os.Remove(filepath.Join(hostRoot, n.Path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("MIG device %s: %w", uuid, err)
			}
		}
	}
	return nil
}

// destroyClaimPartitions destroys the MIG devices the ledger has for the
// claims uids and drops them from it; the caller holds mu. An instance
// that cannot be destroyed stays in the ledger (the next start tries
// again) and is logged.
func (d *Driver) destroyClaimPartitions(uids map[string]bool) {
	l, err := readLedger(d.opts.PluginDir)
	if err != nil || len(l.Made) == 0 {
		if err != nil {
			d.log.WithError(err).Warn("DRA: reading the ledger of MIG devices made on demand")
		}
		return
	}
	gone := map[madeMIG]bool{}
	gpus := map[string]bool{}
	st := d.node.State()
	for _, m := range l.Made {
		if !uids[m.Claim] || d.opts.MIG == nil {
			continue
		}
		if d.destroyMade(st, m.GPU, m.GI, m.CI, m.UUID) {
			gone[m] = true
			gpus[m.GPU] = true
		}
	}
	if len(gone) == 0 {
		return
	}
	if err := l.without(func(m madeMIG) bool { return gone[m] }).write(d.opts.PluginDir); err != nil {
		d.log.WithError(err).Warn("DRA: writing the ledger of MIG devices made on demand")
	}
	d.settleMIGMode(gpus)
	if _, err := d.node.Update(d.node.Config(), "MIG devices made on demand destroyed"); err != nil {
		d.log.WithError(err).Warn("DRA: rediscovering the node")
	}
}

// reconcilePartitions makes NVML, the ledger and the checkpoint agree at
// start: an instance on a dynamic GPU that the ledger does not name is
// destroyed (made by a process that died before recording it); a ledger
// entry of a claim the checkpoint does not have is destroyed; a ledger
// entry whose instance is gone is dropped. What a claim in the checkpoint
// holds is adopted as it is.
func (d *Driver) reconcilePartitions() error {
	st := d.node.State()
	gpus := dynamicGPUs(st)
	if len(gpus) == 0 || d.opts.MIG == nil {
		return nil
	}
	l, err := readLedger(d.opts.PluginDir)
	if err != nil {
		return err
	}
	known := map[[3]string]madeMIG{}
	for _, m := range l.Made {
		known[[3]string{m.GPU, strconv.Itoa(m.GI), strconv.Itoa(m.CI)}] = m
	}
	keep := ledger{}
	changed := false
	for _, g := range gpus {
		insts, err := d.opts.MIG.Instances(g.UUID)
		if err != nil {
			// A GPU NVML cannot answer for (lost) does not keep the
			// driver from starting: its records stay for the next start.
			d.log.WithField("gpu", g.UUID).WithError(err).Warn("DRA: dra.dynamicMIG: the GPU's MIG devices cannot be listed; what was made on it is left as it is")
			for k, m := range known {
				if m.GPU == g.UUID {
					keep.Made = append(keep.Made, m)
					delete(known, k)
				}
			}
			continue
		}
		for _, in := range insts {
			m, ok := known[[3]string{g.UUID, strconv.Itoa(in.GI), strconv.Itoa(in.CI)}]
			if ok {
				delete(known, [3]string{g.UUID, strconv.Itoa(in.GI), strconv.Itoa(in.CI)})
				if _, held := d.ckpt.Claims[m.Claim]; held {
					keep.Made = append(keep.Made, m)
					continue
				}
			}
			d.log.WithFields(logrus.Fields{"gpu": g.UUID, "gi": in.GI, "ci": in.CI, "uuid": in.UUID}).Info("DRA: destroying a MIG device made on demand that no prepared claim holds")
			d.destroyMade(st, g.UUID, in.GI, in.CI, in.UUID)
			changed = true
		}
	}
	dynamic := map[string]bool{}
	for _, g := range gpus {
		dynamic[g.UUID] = true
	}
	for _, m := range known {
		if dynamic[m.GPU] {
			changed = true // recorded, and gone
			continue
		}
		// A GPU that is not one of dra.dynamicMIG's now (taken out of
		// the list, or out of MIG mode): its record stays, for when it
		// is again.
		keep.Made = append(keep.Made, m)
	}
	if changed {
		if err := keep.write(d.opts.PluginDir); err != nil {
			return err
		}
	}
	// A GPU left in MIG mode with no MIG device (a crash between
	// switching and making, or after the last one went) leaves it.
	all := map[string]bool{}
	for _, g := range gpus {
		all[g.UUID] = true
	}
	if left := d.settleMIGMode(all); !changed && !left {
		return nil
	}
	_, err = d.node.Update(st.Config, "MIG devices made on demand reconciled")
	return err
}
