package inventory

import "testing"

func TestUnitKeys(t *testing.T) {
	for _, c := range []struct {
		key  int
		want string
	}{{0, "0"}, {7, "7"}, {MIGKey(0, 0), "0:0"}, {MIGKey(0, 6), "0:6"}, {MIGKey(254, 63), "254:63"}} {
		if got := UnitLabel(c.key); got != c.want {
			t.Errorf("UnitLabel(%d) = %q, want %q", c.key, got, c.want)
		}
	}
	if IsMIGKey(255) || !IsMIGKey(MIGKey(0, 0)) || MIGKey(0, 63) >= MIGKey(1, 0) {
		t.Error("MIG keys overlap GPU indexes or each other")
	}
	var units []GPU
	for _, k := range []int{0, 1, 3, MIGKey(0, 0), MIGKey(0, 1), MIGKey(0, 2), MIGKey(1, 0)} {
		units = append(units, GPU{Index: k})
	}
	if got := IndexRange(units); got != "0-1,3,0:0-0:2,1:0" {
		t.Errorf("IndexRange = %q", got)
	}
}

func TestUnits(t *testing.T) {
	s := &Snapshot{
		GPUs: []GPU{{Index: 0, UUID: "GPU-a", MIGEnabled: true, Node: DeviceNode{Path: "/dev/nvidia0"}}, {Index: 1, UUID: "GPU-b"}, {Index: 2, UUID: "GPU-c", MIGEnabled: true}},
		MIG:  []MIGDevice{{UUID: "MIG-x", Parent: 0, Index: 0, Profile: "1g.10gb"}, {UUID: "MIG-y", Parent: 0, Index: 1, Profile: "1g.10gb"}},
	}
	u := s.Units()
	if len(u) != 3 || u[0].UUID != "GPU-b" || u[1].UUID != "MIG-x" || u[2].Index != MIGKey(0, 1) {
		t.Fatalf("units %+v", u)
	}
	if u[1].MIG == nil || u[1].Node.Path != "/dev/nvidia0" || u[1].MIGEnabled {
		t.Errorf("MIG unit %+v", u[1])
	}
	if s.GPUs[0].MIG != nil {
		t.Error("Units modified the snapshot")
	}
}
