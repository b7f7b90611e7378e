package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestNICs: NICs laid out beside a simulated node's GPUs are published
// with the GPU's PCIe root and their NUMA node, read from sysfs; a claim
// of one is prepared as a CDI device naming its bus id, and unprepared.
func TestNICs(t *testing.T) {
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.AddPCIDevice(simnode.PCIDevice{BusID: "0000:1c:00.0", NUMANode: "1"}); err != nil {
		t.Fatal(err)
	}
	cdi := t.TempDir()
	d, err := newDriver("gpu-a", filepath.Join(n.Root, "sys"), []string{"0000:1c:00.0"}, cdi)
	if err != nil {
		t.Fatal(err)
	}
	devs := d.resources().Pools["gpu-a"].Slices[0].Devices
	if len(devs) != 1 || devs[0].Name != "nic-0" {
		t.Fatalf("devices %v", devs)
	}
	got := describe(devs[0].Attributes)
	want := map[string]string{"type": "nic", "resource.kubernetes.io/pciBusID": "0000:1c:00.0",
		"resource.kubernetes.io/pcieRoot": simnode.PCIeRootFor(n.GPUs[0].BusID), "resource.kubernetes.io/numaNode": "1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("attributes (-want +got):\n%s", diff)
	}
	if _, err := newDriver("gpu-a", filepath.Join(n.Root, "sys"), []string{"0000:99:00.0"}, cdi); err == nil {
		t.Error("a NIC sysfs does not have was published")
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "uid-1"}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	c.Status.Allocation.Devices.Results = []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: "gpu.nri-gpu.dev", Pool: "gpu-a", Device: "gpu-0"},
		{Request: "nic", Driver: DriverName, Pool: "gpu-a", Device: "nic-0"}}
	res, _ := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	wantRes := kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{{Requests: []string{"nic"}, PoolName: "gpu-a", DeviceName: "nic-0",
		CDIDeviceIDs: []string{"k8s.nic.e2e.nri-gpu.dev/claim=uid-1-nic-0"}}}}
	if diff := cmp.Diff(wantRes, res[types.UID("uid-1")]); diff != "" {
		t.Errorf("prepare (-want +got):\n%s", diff)
	}
	spec, err := os.ReadFile(d.specPath("uid-1"))
	if wantSpec := `{"cdiVersion":"0.6.0","kind":"k8s.nic.e2e.nri-gpu.dev/claim","devices":[{"name":"uid-1-nic-0","containerEdits":{"env":["DRA_TEST_NIC_0=0000:1c:00.0"]}}]}`; err != nil || string(spec) != wantSpec {
		t.Errorf("spec %s %v, want %s", spec, err, wantSpec)
	}
	un, _ := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "uid-1"}})
	if err := un["uid-1"]; err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(d.specPath("uid-1")); !os.IsNotExist(err) {
		t.Errorf("the spec stays after unprepare: %v", err)
	}
}
