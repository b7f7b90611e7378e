package dra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// CheckpointFile is the file, in dra.pluginDir, where the prepared claims
// are kept across restarts of nri-gpu, the kubelet and the runtime.
const CheckpointFile = "checkpoint.json"

// CheckpointV1 is the version of the checkpoint's format that this
// nri-gpu writes; reading converts older versions to it (none yet).
const CheckpointV1 = "dra.nri-gpu.dev/v1"

// checkpoint is the prepared claims as written to disk. Why a file and
// not the API server: UnprepareResourceClaims gets a claim's UID, name and
// namespace only, often after the claim was deleted, and must still know
// which devices and CDI spec to release; and the API server may be
// unreachable when nri-gpu starts, while the runtime asks the NRI side
// about the containers of prepared claims at once.
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
	// shared by memory (added within v1: a checkpoint without them reads
	// as no share).
	ShareID      string `json:"shareID,omitempty"`
	ShareMiB     uint64 `json:"shareMiB,omitempty"`
	GPUMemoryMiB uint64 `json:"gpuMemoryMiB,omitempty"`
	// Sharing and MPS are the claim's GpuConfig for the device (added
	// within v1: a checkpoint without them reads as no sharing).
	Sharing string         `json:"sharing,omitempty"`
	MPS     *checkpointMPS `json:"mps,omitempty"`
}

// checkpointMPS is the MPS control daemon of a claim's GPU: where its
// directories are and the limits it holds clients to.
type checkpointMPS struct {
	PipeDir                string `json:"pipeDir"`
	LogDir                 string `json:"logDir"`
	ShmDir                 string `json:"shmDir"`
	ActiveThreadPercentage int    `json:"activeThreadPercentage"`
	PinnedMemoryMiB        uint64 `json:"pinnedMemoryMiB,omitempty"`
}

// ReadPrepared returns the prepared claims of the checkpoint in the
// plugin directory dir (none without one), for the NRI side to book
// before the runtime's Synchronize: a restarted nri-gpu then rebuilds
// the claims' containers as the claims', before its DRA plugin starts.
func ReadPrepared(dir string) (*claims.Prepared, error) {
	c, err := readCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	return c.prepared(), nil
}

// readCheckpoint reads the checkpoint in dir; none is an empty one. A
// version it does not know (a newer nri-gpu's) is an error: guessing
// would risk handing a prepared device out twice.
func readCheckpoint(dir string) (checkpoint, error) {
	data, err := os.ReadFile(filepath.Join(dir, CheckpointFile))
	if errors.Is(err, os.ErrNotExist) {
		return checkpoint{Version: CheckpointV1, Claims: map[string]checkpointClaim{}}, nil
	}
	if err != nil {
		return checkpoint{}, fmt.Errorf("read checkpoint: %w", err)
	}
	var head struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return checkpoint{}, fmt.Errorf("read checkpoint %s: %w", filepath.Join(dir, CheckpointFile), err)
	}
	if head.Version != CheckpointV1 {
		return checkpoint{}, fmt.Errorf("read checkpoint %s: version %q is not one this nri-gpu reads (%s); a newer nri-gpu wrote it", filepath.Join(dir, CheckpointFile), head.Version, CheckpointV1)
	}
	var c checkpoint
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return checkpoint{}, fmt.Errorf("read checkpoint %s: %w", filepath.Join(dir, CheckpointFile), err)
	}
	if c.Claims == nil {
		c.Claims = map[string]checkpointClaim{}
	}
	return c, nil
}

// write writes the checkpoint into dir atomically.
func (c checkpoint) write(dir string) error {
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
			dv.MPS = &claims.MPS{PipeDir: m.PipeDir, LogDir: m.LogDir, ShmDir: m.ShmDir, ActiveThreadPercentage: m.ActiveThreadPercentage,
				PinnedMemoryMiB: m.PinnedMemoryMiB, Why: "nri-gpu mps has not reported the MPS control daemon ready"}
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
			cd.MPS = &checkpointMPS{PipeDir: m.PipeDir, LogDir: m.LogDir, ShmDir: m.ShmDir, ActiveThreadPercentage: m.ActiveThreadPercentage, PinnedMemoryMiB: m.PinnedMemoryMiB}
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
