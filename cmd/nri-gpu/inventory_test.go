package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// TestInventoryPrintsIMEXChannels: `nri-gpu inventory` lists the IMEX
// channels discovery found, in the table and in JSON.
func TestInventoryPrintsIMEXChannels(t *testing.T) {
	s := &inventory.Snapshot{IMEXChannels: []inventory.IMEXChannel{
		{Number: 0, Node: inventory.DeviceNode{Path: inventory.IMEXChannelPath(0), Major: 500, Minor: 0, Mode: 0o666}},
		{Number: 1, Node: inventory.DeviceNode{Path: inventory.IMEXChannelPath(1), Major: 500, Minor: 1, Mode: 0o666}},
	}}
	var table bytes.Buffer
	if err := writeTable(&table, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"IMEX channels: 2", "/dev/nvidia-caps-imex-channels/channel1  500:1  0666"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var js bytes.Buffer
	if err := writeJSON(&js, s); err != nil {
		t.Fatal(err)
	}
	var v inventoryView
	if err := json.Unmarshal(js.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.IMEXChannels) != 2 || v.IMEXChannels[1].Path != "/dev/nvidia-caps-imex-channels/channel1" || v.IMEXChannels[1].Major != 500 {
		t.Errorf("JSON imexChannels %+v", v.IMEXChannels)
	}
}

// TestInventoryPrintsNVML: `nri-gpu inventory` prints what NVML says of
// each GPU and each MIG device's GPU instance, in the table (the MIG
// table's new columns last, where mig-fidelity.sh does not read) and in
// JSON; without NVML, neither.
func TestInventoryPrintsNVML(t *testing.T) {
	node := inventory.DeviceNode{Path: "/dev/nvidia-caps/nvidia-cap93", Major: 508, Minor: 93, Mode: 0o444}
	s := &inventory.Snapshot{NVML: "ok",
		GPUs: []inventory.GPU{
			{Index: 0, UUID: "GPU-a", Model: "NVIDIA H100 80GB HBM3", MIGEnabled: true, Props: &inventory.GPUProps{ProductName: "NVIDIA H100 80GB HBM3",
				MemoryBytes: 81559 << 20, Brand: "Nvidia", Architecture: "Hopper", ComputeCapability: "9.0", CUDADriverVersion: "13.0"}},
			{Index: 1, UUID: "GPU-b", Model: "NVIDIA H100 80GB HBM3"},
		},
		MIG: []inventory.MIGDevice{{UUID: "MIG-a", Index: 0, Parent: 0, ParentUUID: "GPU-a", Profile: "1g.10gb", MemoryMiB: 9984, GI: 13,
			GINode: node, CINode: node, Placement: &inventory.MIGPlacement{ProfileID: 19, Start: 6, Size: 1},
			Engines: inventory.MIGEngines{Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1}}},
	}
	var table bytes.Buffer
	if err := writeTable(&table, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"0      NVIDIA H100 80GB HBM3  Nvidia  Hopper        9.0      81559 MiB  13.0  -",
		"0:0   MIG-a  1g.10gb  0    13  0   /dev/nvidia-caps/nvidia-cap93 508:93  /dev/nvidia-caps/nvidia-cap93 508:93  9984 MiB  19          6:1        16",
	} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	_, nvmlRows, _ := strings.Cut(table.String(), "\nNVML:\n")
	nvmlRows, _, _ = strings.Cut(nvmlRows, "\n\n")
	if n := strings.Count(nvmlRows, "\n"); n != 1 {
		t.Errorf("NVML's table has %d rows after its header, want 1 (GPU 1 has no properties):\n%s", n, table.String())
	}
	var js bytes.Buffer
	if err := writeJSON(&js, s); err != nil {
		t.Fatal(err)
	}
	var v inventoryView
	if err := json.Unmarshal(js.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if p := v.GPUs[0].NVML; p == nil || p.Architecture != "Hopper" || p.MemoryBytes != 81559<<20 || v.GPUs[1].NVML != nil {
		t.Errorf("JSON gpus[].nvml: %+v, %+v", v.GPUs[0].NVML, v.GPUs[1].NVML)
	}
	if m := v.MIG[0]; m.Placement == nil || *m.Placement != (placementView{ProfileID: 19, Start: 6, Size: 1}) || m.Engines == nil || m.Engines.Multiprocessors != 16 {
		t.Errorf("JSON mig[0]: %+v", m)
	}
}
