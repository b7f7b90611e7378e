package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// CheckpointFile is the file, in dra.pluginDir, where the prepared claims
// are kept across restarts of nri-gpu, the kubelet and the runtime.
const CheckpointFile = "checkpoint.json"

// The versions of the checkpoint's format. A field added to the format
// makes a new version (TestCheckpointFormat holds the fields of each):
// an nri-gpu reads every version up to its own, converting the older
// ones, and refuses a newer one, whose fields it cannot know.
const (
	// CheckpointV1 has each prepared claim's devices: request, name,
	// UUID, identifying and CDI device nodes, adminAccess, CDI device ID;
	// and, optional, added within v1 by the nri-gpu that wrote them, a
	// share of the GPU's memory (shareID, shareMiB, gpuMemoryMiB), the
	// sharing strategy and the MPS control daemon (sharing, mps). An
	// nri-gpu from before those fields refuses a file that has them.
	CheckpointV1 = "dra.nri-gpu.dev/v1"
	// CheckpointV2 is v1 with the share, the sharing strategy and the
	// MPS daemon as fields of the version, the daemon's limits in the
	// form of sharing.MPSLimits (pinnedMemoryMiB written when 0).
	CheckpointV2 = "dra.nri-gpu.dev/v2"
	// CheckpointVersion is the version this nri-gpu writes.
	CheckpointVersion = CheckpointV2
)

// checkpoint is the prepared claims as written to disk, version
// CheckpointVersion. Why a file and not the API server:
// UnprepareResourceClaims gets a claim's UID, name and namespace only,
// often after the claim was deleted, and must still know which devices
// and CDI spec to release; and the API server may be unreachable when
// nri-gpu starts, while the runtime asks the NRI side about the
// containers of prepared claims at once. It is read by this driver (New),
// by nri-gpu run before the runtime's Synchronize (ReadPrepared), by
// nri-gpu mps (the daemons of claims with MPS) and by nri-gpu doctor.
type checkpoint struct {
	Version string `json:"version"`
	// Claims are the prepared claims by UID.
	Claims map[string]checkpointClaim `json:"claims"`
}

type checkpointClaim struct {
	Namespace string             `json:"namespace"`
	Name      string             `json:"name"`
	Devices   []checkpointDevice `json:"devices"`
}

type checkpointDevice struct {
	Request     string   `json:"request"`
	Device      string   `json:"device"`
	UUID        string   `json:"uuid"`
	MIG         bool     `json:"mig,omitempty"`
	Node        string   `json:"node"`
	Nodes       []string `json:"nodes"`
	AdminAccess bool     `json:"adminAccess,omitempty"`
	CDIDevice   string   `json:"cdiDevice"`
	// ShareID, ShareMiB and GPUMemoryMiB are the claim's share of a GPU
	// shared by memory; empty: none.
	ShareID      string `json:"shareID,omitempty"`
	ShareMiB     uint64 `json:"shareMiB,omitempty"`
	GPUMemoryMiB uint64 `json:"gpuMemoryMiB,omitempty"`
	// Sharing and MPS are the claim's GpuConfig for the device; empty:
	// no sharing asked.
	Sharing string         `json:"sharing,omitempty"`
	MPS     *checkpointMPS `json:"mps,omitempty"`
}

// checkpointMPS is the MPS control daemon of a claim's GPU: where its
// directories are and the limits it holds each client of the claim to.
type checkpointMPS struct {
	PipeDir string `json:"pipeDir"`
	LogDir  string `json:"logDir"`
	ShmDir  string `json:"shmDir"`
	sharing.MPSLimits
}

// CheckpointError is a checkpoint that exists and cannot be read:
// truncated, not JSON, of a version this nri-gpu does not know, or
// naming a device without its UUID or node. Its prepared claims are
// unknown, so their GPUs cannot be told apart from free ones: nri-gpu
// holds the DRA driver's GPUs and stays not ready until it reads.
type CheckpointError struct {
	Path string
	Err  error
}

func (e *CheckpointError) Error() string { return "read checkpoint " + e.Path + ": " + e.Err.Error() }

func (e *CheckpointError) Unwrap() error { return e.Err }

// ReadPrepared returns the prepared claims of the checkpoint in the
// plugin directory dir (none without one), for the NRI side to book
// before the runtime's Synchronize: a restarted nri-gpu then rebuilds
// the claims' containers as the claims', before its DRA plugin starts.
// An error is a *CheckpointError, or an I/O error reading the file.
func ReadPrepared(dir string) (*claims.Prepared, error) {
	c, err := readCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	return c.prepared(), nil
}

// CountPrepared returns how many claims the checkpoint in the plugin
// directory dir has prepared (nri-gpu doctor), or why it cannot be read.
func CountPrepared(dir string) (int, error) {
	c, err := readCheckpoint(dir)
	return len(c.Claims), err
}

// readCheckpoint reads the checkpoint in dir, of any version up to
// CheckpointVersion, as CheckpointVersion; none is an empty one. A
// version it does not know (a newer nri-gpu's), a file it cannot decode
// strictly (truncated, a field unknown or given twice) or a device
// without its identity is a *CheckpointError: guessing would risk
// handing a prepared device out twice.
func readCheckpoint(dir string) (checkpoint, error) {
	path := filepath.Join(dir, CheckpointFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return checkpoint{Version: CheckpointVersion, Claims: map[string]checkpointClaim{}}, nil
	}
	if err != nil {
		return checkpoint{}, fmt.Errorf("read checkpoint: %w", err)
	}
	c, err := decodeCheckpoint(data)
	if err != nil {
		return checkpoint{}, &CheckpointError{Path: path, Err: err}
	}
	return c, nil
}

// decodeCheckpoint decodes a checkpoint of any version this nri-gpu
// reads, converted to CheckpointVersion.
func decodeCheckpoint(data []byte) (checkpoint, error) {
	var head struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return checkpoint{}, err
	}
	var c checkpoint
	switch head.Version {
	case CheckpointV1:
		var v1 checkpointV1
		if err := decodeStrict(data, &v1); err != nil {
			return checkpoint{}, err
		}
		c = v1.convert()
	case CheckpointV2:
		if err := decodeStrict(data, &c); err != nil {
			return checkpoint{}, err
		}
	default:
		return checkpoint{}, fmt.Errorf("version %q is not one this nri-gpu reads (%s, %s): a newer nri-gpu wrote it, and its prepared claims cannot be known here; "+
			"run that nri-gpu again, or see the DRA documentation on rolling back", head.Version, CheckpointV1, CheckpointV2)
	}
	if c.Claims == nil {
		c.Claims = map[string]checkpointClaim{}
	}
	return c, c.check()
}

// check refuses a checkpoint whose devices lack what identifies them.
func (c checkpoint) check() error {
	for uid, cc := range c.Claims {
		for i, d := range cc.Devices {
			if uid == "" || d.Device == "" || d.UUID == "" || d.Node == "" || len(d.Nodes) == 0 {
				return fmt.Errorf("claim %q (%s/%s) device %d lacks its UID, name, UUID or device nodes", uid, cc.Namespace, cc.Name, i)
			}
		}
	}
	return nil
}

// write writes the checkpoint into dir atomically.
func (c checkpoint) write(dir string) error {
	c.Version = CheckpointVersion
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return writeAtomic(filepath.Join(dir, CheckpointFile), append(data, '\n'), 0o600)
}

// prepared returns the checkpoint's devices as the request path reads
// them, in a stable order (claim UID, then the claim's order).
func (c checkpoint) prepared() *claims.Prepared {
	uids := make([]string, 0, len(c.Claims))
	for uid := range c.Claims {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	var devs []claims.Device
	for _, uid := range uids {
		devs = append(devs, c.Claims[uid].devices(uid)...)
	}
	return claims.New(devs)
}

func (cc checkpointClaim) devices(uid string) []claims.Device {
	ref := claims.Claim{UID: uid, Namespace: cc.Namespace, Name: cc.Name}
	out := make([]claims.Device, 0, len(cc.Devices))
	for _, d := range cc.Devices {
		dv := claims.Device{Claim: ref, Request: d.Request, Name: d.Device, UUID: d.UUID, MIG: d.MIG,
			Node: d.Node, Nodes: slices.Clone(d.Nodes), AdminAccess: d.AdminAccess, CDIDevice: d.CDIDevice, Sharing: d.Sharing,
			Share: claims.Share{ID: d.ShareID, MemoryMiB: d.ShareMiB, GPUMemoryMiB: d.GPUMemoryMiB}}
		if m := d.MPS; m != nil {
			dv.MPS = &sharing.MPSDaemon{PipeDir: m.PipeDir, LogDir: m.LogDir, ShmDir: m.ShmDir, MPSLimits: m.MPSLimits, Why: sharing.NotReported}
		}
		out = append(out, dv)
	}
	return out
}

func checkpointDevices(devs []claims.Device) []checkpointDevice {
	out := make([]checkpointDevice, 0, len(devs))
	for _, d := range devs {
		cd := checkpointDevice{Request: d.Request, Device: d.Name, UUID: d.UUID, MIG: d.MIG, Node: d.Node,
			Nodes: slices.Clone(d.Nodes), AdminAccess: d.AdminAccess, CDIDevice: d.CDIDevice, Sharing: d.Sharing,
			ShareID: d.Share.ID, ShareMiB: d.Share.MemoryMiB, GPUMemoryMiB: d.Share.GPUMemoryMiB}
		if m := d.MPS; m != nil {
			cd.MPS = &checkpointMPS{PipeDir: m.PipeDir, LogDir: m.LogDir, ShmDir: m.ShmDir, MPSLimits: m.MPSLimits}
		}
		out = append(out, cd)
	}
	return out
}

// clone returns a copy of c whose map can be changed.
func (c checkpoint) clone() checkpoint {
	out := checkpoint{Version: c.Version, Claims: make(map[string]checkpointClaim, len(c.Claims))}
	for k, v := range c.Claims {
		out.Claims[k] = v
	}
	return out
}
