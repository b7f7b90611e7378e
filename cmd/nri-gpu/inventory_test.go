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
