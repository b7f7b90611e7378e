package dra

// checkpointV1 is a checkpoint of version CheckpointV1 as the nri-gpu
// that wrote it last had it, fields added within v1 included. It is
// frozen: read only, converted to the current version (convert).
type checkpointV1 struct {
	Version string             `json:"version"`
	Claims  map[string]claimV1 `json:"claims"`
}

type claimV1 struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	Devices   []deviceV1 `json:"devices"`
}

type deviceV1 struct {
	Request      string   `json:"request"`
	Device       string   `json:"device"`
	UUID         string   `json:"uuid"`
	MIG          bool     `json:"mig,omitempty"`
	Node         string   `json:"node"`
	Nodes        []string `json:"nodes"`
	AdminAccess  bool     `json:"adminAccess,omitempty"`
	CDIDevice    string   `json:"cdiDevice"`
	ShareID      string   `json:"shareID,omitempty"`
	ShareMiB     uint64   `json:"shareMiB,omitempty"`
	GPUMemoryMiB uint64   `json:"gpuMemoryMiB,omitempty"`
	Sharing      string   `json:"sharing,omitempty"`
	MPS          *mpsV1   `json:"mps,omitempty"`
}

type mpsV1 struct {
	PipeDir                string `json:"pipeDir"`
	LogDir                 string `json:"logDir"`
	ShmDir                 string `json:"shmDir"`
	ActiveThreadPercentage int    `json:"activeThreadPercentage"`
	PinnedMemoryMiB        uint64 `json:"pinnedMemoryMiB,omitempty"`
}

// convert returns the v1 checkpoint as CheckpointVersion: the same
// claims and devices; a v1 file without the fields added within v1 has
// no shares and no sharing.
func (v checkpointV1) convert() checkpoint {
	out := checkpoint{Version: CheckpointVersion, Claims: make(map[string]checkpointClaim, len(v.Claims))}
	for uid, c := range v.Claims {
		cc := checkpointClaim{Namespace: c.Namespace, Name: c.Name, Devices: make([]checkpointDevice, 0, len(c.Devices))}
		for _, d := range c.Devices {
			nd := checkpointDevice{Request: d.Request, Device: d.Device, UUID: d.UUID, MIG: d.MIG, Node: d.Node, Nodes: d.Nodes,
				AdminAccess: d.AdminAccess, CDIDevice: d.CDIDevice, ShareID: d.ShareID, ShareMiB: d.ShareMiB, GPUMemoryMiB: d.GPUMemoryMiB, Sharing: d.Sharing}
			if m := d.MPS; m != nil {
				nd.MPS = &checkpointMPS{PipeDir: m.PipeDir, LogDir: m.LogDir, ShmDir: m.ShmDir}
				nd.MPS.ActiveThreadPercentage, nd.MPS.PinnedMemoryMiB = m.ActiveThreadPercentage, m.PinnedMemoryMiB
			}
			cc.Devices = append(cc.Devices, nd)
		}
		out.Claims[uid] = cc
	}
	return out
}
