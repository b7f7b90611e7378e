package simnode

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// TestPCIeRoots: Kubernetes' own helper, as a DRA driver calls it, finds
// each simulated GPU's PCIe root complex in the node's sysfs, one per
// default GPU, and a NIC added at the next bus number under the GPU's;
// the NUMA node files are read through the links as the kernel's are.
func TestPCIeRoots(t *testing.T) {
	n, err := Generate(t.TempDir(), Options{GPUs: []GPU{{BusID: DefaultBusID(0), NUMANode: "0"}, {BusID: DefaultBusID(1), NUMANode: "1"}, {BusID: DefaultBusID(2)}}})
	if err != nil {
		t.Fatal(err)
	}
	sys := deviceattribute.WithFSFromRoot(filepath.Join(n.Root, "sys"))
	roots := map[string]bool{}
	for _, g := range n.GPUs {
		a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(g.BusID, sys)
		if err != nil {
			t.Fatalf("GPU %s: %v", g.BusID, err)
		}
		if got, want := *a.Value.StringValue, PCIeRootFor(g.BusID); got != want || roots[got] {
			t.Errorf("GPU %s: root %s, want %s, one per GPU (have %v)", g.BusID, got, want, roots)
		}
		roots[*a.Value.StringValue] = true
	}
	if got := PCIeRootFor("0000:1b:00.0"); got != "pci0000:10" {
		t.Errorf("PCIeRootFor(0000:1b:00.0) = %s, want pci0000:10", got)
	}
	if err := n.AddPCIDevice(PCIDevice{BusID: "0000:1c:00.0", NUMANode: "0"}); err != nil {
		t.Fatal(err)
	}
	a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID("0000:1c:00.0", sys)
	if err != nil || *a.Value.StringValue != PCIeRootFor(n.GPUs[0].BusID) {
		t.Errorf("the NIC beside GPU 0: %v %v, want GPU 0's root %s", a, err, PCIeRootFor(n.GPUs[0].BusID))
	}
	numa, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(n.GPUs[1].BusID, deviceattribute.ScalarAttribute, sys)
	if err != nil || numa.Value.IntValue == nil || *numa.Value.IntValue != 1 {
		t.Errorf("GPU 1's numaNode: %v %v, want 1", numa, err)
	}
	if err := n.AddPCIDevice(PCIDevice{BusID: "bad"}); err == nil {
		t.Error("AddPCIDevice accepted bus id \"bad\"")
	}
	if class, err := os.ReadFile(filepath.Join(n.Root, "sys/bus/pci/devices", n.GPUs[0].BusID, "class")); err != nil || string(class) != "0x030200\n" {
		t.Errorf("GPU 0's class: %q %v", class, err)
	}
}
