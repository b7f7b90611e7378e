package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// inventoryView is the JSON form of a snapshot printed by `nri-gpu
// inventory -o json`.
type inventoryView struct {
	HostRoot      string     `json:"hostRoot"`
	DriverRoot    string     `json:"driverRoot"`
	DriverVersion string     `json:"driverVersion"`
	KernelRelease string     `json:"kernelRelease"`
	GPUs          []gpuView  `json:"gpus"`
	MIG           []migView  `json:"mig"`
	MIGControl    []nodeView `json:"migControlNodes"`
	NVML          string     `json:"nvml,omitempty"`
	ControlNodes  []nodeView `json:"controlNodes"`
	IMEXChannels  []nodeView `json:"imexChannels"`
	Files         []fileView `json:"files"`
	Warnings      []string   `json:"warnings"`
}

type gpuView struct {
	Index int      `json:"index"`
	Minor int      `json:"minor"`
	UUID  string   `json:"uuid"`
	BusID string   `json:"busId"`
	Model string   `json:"model"`
	Node  nodeView `json:"node"`
	// DRM are the GPU's /dev/dri card and render nodes, when it has.
	DRM []nodeView `json:"drm,omitempty"`
	MIG bool       `json:"mig,omitempty"`
	// NVML is what NVML says of the GPU; absent without NVML.
	NVML *nvmlView `json:"nvml,omitempty"`
}

// nvmlView is a GPU's properties as NVML reports them (what the DRA
// driver publishes); an empty field is unknown.
type nvmlView struct {
	ProductName       string `json:"productName,omitempty"`
	MemoryBytes       uint64 `json:"memoryBytes,omitempty"`
	Brand             string `json:"brand,omitempty"`
	Architecture      string `json:"architecture,omitempty"`
	ComputeCapability string `json:"cudaComputeCapability,omitempty"`
	CUDADriverVersion string `json:"cudaDriverVersion,omitempty"`
	AddressingMode    string `json:"addressingMode,omitempty"`
}

// migView is one MIG device.
type migView struct {
	Name       string   `json:"name"`
	UUID       string   `json:"uuid"`
	Profile    string   `json:"profile"`
	Parent     int      `json:"parent"`
	ParentUUID string   `json:"parentUuid"`
	GI         int      `json:"gi"`
	CI         int      `json:"ci"`
	MemoryMiB  uint64   `json:"memoryMiB"`
	GINode     nodeView `json:"giNode"`
	CINode     nodeView `json:"ciNode"`
	// Placement is the GPU instance's profile id and memory slices;
	// absent when NVML does not tell.
	Placement *placementView `json:"placement,omitempty"`
	// Engines are the device's multiprocessors and engines; absent when
	// unknown.
	Engines *inventory.MIGEngines `json:"engines,omitempty"`
}

type placementView struct {
	ProfileID int `json:"profileId"`
	Start     int `json:"start"`
	Size      int `json:"size"`
}

type nodeView struct {
	Path  string `json:"path"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
	Mode  string `json:"mode"`
}

type fileView struct {
	Kind       string `json:"kind"`
	Capability string `json:"capability,omitempty"`
	Name       string `json:"name"`
	HostPath   string `json:"hostPath"`
}

func nodeOf(n inventory.DeviceNode) nodeView {
	return nodeView{Path: n.Path, Major: n.Major, Minor: n.Minor, Mode: fmt.Sprintf("%04o", uint32(n.Mode))}
}

func viewOf(s *inventory.Snapshot) inventoryView {
	v := inventoryView{
		HostRoot: s.HostRoot, DriverRoot: s.DriverRoot, DriverVersion: s.DriverVersion, KernelRelease: s.KernelRelease,
		GPUs: []gpuView{}, MIG: []migView{}, MIGControl: []nodeView{}, NVML: s.NVML,
		ControlNodes: []nodeView{}, IMEXChannels: []nodeView{}, Files: []fileView{}, Warnings: []string{},
	}
	for _, g := range s.GPUs {
		gv := gpuView{Index: g.Index, Minor: g.Minor, UUID: g.UUID, BusID: g.BusID, Model: g.Model, Node: nodeOf(g.Node), MIG: g.MIGEnabled}
		if p := g.Props; p != nil {
			gv.NVML = &nvmlView{ProductName: p.ProductName, MemoryBytes: p.MemoryBytes, Brand: p.Brand, Architecture: p.Architecture,
				ComputeCapability: p.ComputeCapability, CUDADriverVersion: p.CUDADriverVersion, AddressingMode: p.AddressingMode}
		}
		for _, n := range []inventory.DeviceNode{g.Card(), g.Render()} {
			if n.Path != "" {
				gv.DRM = append(gv.DRM, nodeOf(n))
			}
		}
		v.GPUs = append(v.GPUs, gv)
	}
	for _, m := range s.MIG {
		mv := migView{Name: m.Name(), UUID: m.UUID, Profile: m.Profile, Parent: m.Parent, ParentUUID: m.ParentUUID,
			GI: m.GI, CI: m.CI, MemoryMiB: m.MemoryMiB, GINode: nodeOf(m.GINode), CINode: nodeOf(m.CINode)}
		if p := m.Placement; p != nil {
			mv.Placement = &placementView{ProfileID: p.ProfileID, Start: p.Start, Size: p.Size}
		}
		if e := m.Engines; e != (inventory.MIGEngines{}) {
			mv.Engines = &e
		}
		v.MIG = append(v.MIG, mv)
	}
	for _, n := range []*inventory.DeviceNode{s.MIGControl.Config, s.MIGControl.Monitor} {
		if n != nil {
			v.MIGControl = append(v.MIGControl, nodeOf(*n))
		}
	}
	for _, n := range []*inventory.DeviceNode{s.Control.Ctl, s.Control.UVM, s.Control.UVMTools, s.Control.Modeset} {
		if n != nil {
			v.ControlNodes = append(v.ControlNodes, nodeOf(*n))
		}
	}
	for _, c := range s.IMEXChannels {
		v.IMEXChannels = append(v.IMEXChannels, nodeOf(c.Node))
	}
	for _, f := range s.Files {
		fv := fileView{Kind: f.Kind.String(), Name: f.Name, HostPath: f.HostPath}
		if f.Capability != 0 {
			fv.Capability = f.Capability.String()
		}
		v.Files = append(v.Files, fv)
	}
	v.Warnings = append(v.Warnings, s.Warnings...)
	return v
}

func writeJSON(w io.Writer, s *inventory.Snapshot) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(viewOf(s))
}

// writeTable writes the snapshot as nri-gpu inventory's table: the driver
// and roots, then one section per kind of thing discovered. It is one
// piece on purpose: the table's layout, read top to bottom, each section
// a few lines of its own.
func writeTable(w io.Writer, s *inventory.Snapshot) error {
	v := viewOf(s)
	drv := v.DriverVersion
	if drv == "" {
		drv = "(none)"
	}
	kernel := v.KernelRelease
	if kernel == "" {
		kernel = "(unknown)"
	}
	fmt.Fprintf(w, "Driver version: %s\nKernel: %s\nhostRoot: %s  driverRoot: %s\n\n", drv, kernel, v.HostRoot, v.DriverRoot)

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "GPUs: %d\n", len(v.GPUs))
	if len(v.GPUs) > 0 {
		fmt.Fprintln(tw, "INDEX\tMINOR\tUUID\tBUS ID\tMODEL\tNODE\tDRM")
		for _, g := range v.GPUs {
			drm := "-"
			for i, n := range g.DRM {
				if i == 0 {
					drm = ""
				} else {
					drm += " "
				}
				drm += n.Path
			}
			model := g.Model
			if g.MIG {
				model += " (MIG)"
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s %d:%d %s\t%s\n", g.Index, g.Minor, g.UUID, g.BusID, model, g.Node.Path, g.Node.Major, g.Node.Minor, g.Node.Mode, drm)
		}
	}
	writeNVMLTable(tw, v.GPUs)
	if len(v.MIG) > 0 || v.NVML != "" {
		fmt.Fprintf(tw, "\nMIG devices: %d", len(v.MIG))
		if v.NVML != "ok" && v.NVML != "" {
			fmt.Fprintf(tw, " (NVML %s)", v.NVML)
		}
		fmt.Fprintln(tw)
	}
	if len(v.MIG) > 0 {
		// The columns of NVML's GPU instance come last: tools read the
		// others by position (deploy/tools/mig-fidelity.sh).
		fmt.Fprintln(tw, "NAME\tUUID\tPROFILE\tGPU\tGI\tCI\tGI NODE\tCI NODE\tMEMORY\tPROFILE ID\tPLACEMENT\tSM")
		for _, m := range v.MIG {
			id, placement, sm := "-", "-", "-"
			if p := m.Placement; p != nil {
				id, placement = fmt.Sprint(p.ProfileID), fmt.Sprintf("%d:%d", p.Start, p.Size)
			}
			if m.Engines != nil {
				sm = fmt.Sprint(m.Engines.Multiprocessors)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s %d:%d\t%s %d:%d\t%d MiB\t%s\t%s\t%s\n", m.Name, m.UUID, m.Profile, m.Parent, m.GI, m.CI,
				m.GINode.Path, m.GINode.Major, m.GINode.Minor, m.CINode.Path, m.CINode.Major, m.CINode.Minor, m.MemoryMiB, id, placement, sm)
		}
		for _, n := range v.MIGControl {
			fmt.Fprintf(tw, "MIG management: %s %d:%d\n", n.Path, n.Major, n.Minor)
		}
	}
	fmt.Fprintf(tw, "\nControl nodes: %d\n", len(v.ControlNodes))
	for _, n := range v.ControlNodes {
		fmt.Fprintf(tw, "%s\t%d:%d\t%s\n", n.Path, n.Major, n.Minor, n.Mode)
	}
	if len(v.IMEXChannels) > 0 {
		fmt.Fprintf(tw, "\nIMEX channels: %d\n", len(v.IMEXChannels))
		for _, n := range v.IMEXChannels {
			fmt.Fprintf(tw, "%s\t%d:%d\t%s\n", n.Path, n.Major, n.Minor, n.Mode)
		}
	}
	fmt.Fprintf(tw, "\nDriver files: %d\n", len(v.Files))
	if len(v.Files) > 0 {
		fmt.Fprintln(tw, "CAPABILITY\tKIND\tNAME\tHOST PATH")
		for _, f := range v.Files {
			c := f.Capability
			if c == "" {
				c = "(always)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c, f.Kind, f.Name, f.HostPath)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(v.Warnings) > 0 {
		fmt.Fprintf(w, "\nWarnings: %d\n", len(v.Warnings))
		for _, s := range v.Warnings {
			fmt.Fprintf(w, "- %s\n", s)
		}
	}
	return nil
}

// writeNVMLTable writes what NVML says of the GPUs, when it says
// anything: the properties the DRA driver publishes.
func writeNVMLTable(w io.Writer, gpus []gpuView) {
	some := false
	for _, g := range gpus {
		some = some || g.NVML != nil
	}
	if !some {
		return
	}
	or := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	fmt.Fprintln(w, "\nNVML:\nINDEX\tPRODUCT\tBRAND\tARCHITECTURE\tCOMPUTE\tMEMORY\tCUDA\tADDRESSING")
	for _, g := range gpus {
		if p := g.NVML; p != nil {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d MiB\t%s\t%s\n", g.Index, or(p.ProductName), or(p.Brand), or(p.Architecture),
				or(p.ComputeCapability), p.MemoryBytes>>20, or(p.CUDADriverVersion), or(p.AddressingMode))
		}
	}
}
