package node_test

import (
	"io"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

func memState() *node.State {
	return &node.State{Config: config.Default(), Source: adjust.Prepare(simnode.MemorySnapshot(), adjust.Layout{LibraryDir: "/l", Library32Dir: "/l32"})}
}

// TestSubscribe checks that subscribers are told every state made current
// after they subscribe, after OnChange and once requests can read it, and
// nothing after they cancel.
func TestSubscribe(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	var order []string
	first := memState()
	n := node.Fixed(first, log, node.OnChange(func(*node.State) { order = append(order, "onChange") }))
	var a, b []*node.State
	cancelA := n.Subscribe(func(st *node.State) {
		if n.State() != st {
			t.Error("subscriber called before the state is current")
		}
		order = append(order, "a")
		a = append(a, st)
	})
	n.Subscribe(func(st *node.State) { b = append(b, st) })

	second := memState()
	n.Swap(second)
	cancelA()
	third := memState()
	n.Swap(third)

	if len(a) != 1 || a[0] != second {
		t.Errorf("subscriber a saw %d states, want the second only", len(a))
	}
	if len(b) != 2 || b[0] != second || b[1] != third {
		t.Errorf("subscriber b saw %d states, want the second and the third", len(b))
	}
	if want := []string{"onChange", "onChange", "a", "onChange"}; len(order) != len(want) || order[1] != "onChange" || order[2] != "a" {
		t.Errorf("calls %q, want %q", order, want)
	}
	if n.State() != third {
		t.Error("Swap did not make the state current")
	}
}
