// Package alloc keeps the node's allocation table: which containers hold
// which GPUs, shared or exclusively. It picks the GPUs of count requests,
// refuses requests that would break an exclusive holding, releases a
// container's GPUs when it goes away, and is rebuilt whole from what the
// runtime reports on every (re)connection. It does no I/O: the plugin feeds
// it events.
package alloc

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Holder names a container that holds GPUs.
type Holder struct {
	// ID is the runtime's container ID: the key of a holding.
	ID        string `json:"id"`
	PodID     string `json:"podId,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	// Claim is the name of the Dynamic Resource Allocation claim that
	// holds the GPUs (ClaimHolder), in Namespace.
	Claim string `json:"claim,omitempty"`
}

// String names the holder as namespace/pod/container, for messages; a
// pod's own holding (a pod-level request, PodHolder) as namespace/pod; a
// claim's (ClaimHolder) as "claim namespace/name".
func (h Holder) String() string {
	switch {
	case h.ID == UnknownClaimsID:
		return "the DRA driver's prepared claims (its checkpoint cannot be read)"
	case h.Claim != "":
		return "claim " + h.Namespace + "/" + h.Claim
	case h.Pod == "" && h.Container == "":
		return "container " + h.ID
	case h.Container == "":
		return h.Namespace + "/" + h.Pod
	}
	return h.Namespace + "/" + h.Pod + "/" + h.Container
}

// PodHolderPrefix starts the ID of a pod's own holding: "pod:" and the
// pod's sandbox ID. Container IDs are hexadecimal, so the two never meet.
const PodHolderPrefix = "pod:"

// PodHolder names the pod with the given sandbox ID as the holder of the
// GPUs of a pod-level request, which all its containers share.
func PodHolder(podID, namespace, pod string) Holder {
	return Holder{ID: PodHolderPrefix + podID, PodID: podID, Namespace: namespace, Pod: pod}
}

// ClaimHolderPrefix starts the ID of a Dynamic Resource Allocation
// claim's holding: "claim:" and the claim's UID. A claim holds its
// devices once, whichever containers and pods use it, from its Prepare to
// its Unprepare (SyncClaims); no container's stop or removal releases it.
const ClaimHolderPrefix = "claim:"

// ClaimHolder names the prepared claim namespace/name with the given UID
// as the holder of its devices.
func ClaimHolder(uid, namespace, name string) Holder {
	return Holder{ID: ClaimHolderPrefix + uid, Namespace: namespace, Claim: name}
}

// UnknownClaimsID is the ID of UnknownClaims' holding.
const UnknownClaimsID = ClaimHolderPrefix + "*"

// UnknownClaims names the holder of the GPUs the DRA driver offers while
// its checkpoint cannot be read: its prepared claims are unknown, so every
// one of its GPUs may be a claim's. It is the node's, no tenant's: every
// message names it. SyncClaims releases it with the first set of claims
// read.
func UnknownClaims() Holder { return Holder{ID: UnknownClaimsID, Claim: "*"} }

// Holding is what one container holds.
type Holding struct {
	Holder Holder
	Mode   sharing.Mode
	// GPUs are indices, ascending.
	GPUs []int
	// Members are the containers that share a pod's holding (PodHolder):
	// the one that booked it and those that joined it (Join).
	Members []string
	// Kubelet is set when the GPUs are the kubelet's assignment (its
	// device plugin's Allocate, checked against the container's device
	// nodes), not a request nri-gpu read.
	Kubelet bool
	// Runtime is set when the runtime gave the container the GPUs (a
	// device plugin's DeviceSpecs, --device, CDI devices; the kubelet's
	// assignment too): a count request never gets them, in shared mode
	// either, since their allocator hands them out by its own accounting.
	Runtime bool
}

// Request asks for the GPUs of one container.
type Request struct {
	Holder Holder
	Mode   sharing.Mode
	// Count, when positive, asks for that many GPUs picked by the table.
	// Otherwise GPUs lists the indices wanted.
	Count int
	GPUs  []int
	// Source names where the request came from, for messages
	// ("annotation gpus.nri-gpu.dev/pod").
	Source string
	// Member is the container that books or joins a pod's holding
	// (Join).
	Member string
	// Kubelet marks the holding as the kubelet's assignment
	// (Holding.Kubelet).
	Kubelet bool
	// Runtime marks the GPUs as the runtime's gift (Holding.Runtime);
	// Kubelet implies it.
	Runtime bool
}

// Error is a request the table cannot meet. Its message, which the
// runtime shows to the pod, says why and names the holders of the
// requester's own namespace; a holder in another namespace is "a pod in
// another namespace", so that a tenant learns nothing of another's pods.
// Detail names every holder, for nri-gpu's own log.
type Error struct {
	Source string
	Msg    string
	// Detail is Msg with every holder named.
	Detail string
}

func (e *Error) Error() string { return "nri-gpu: " + e.Source + ": " + e.Msg }

// Logged is the error's message with every holder named, for nri-gpu's
// own log.
func (e *Error) Logged() string {
	if e.Detail == "" {
		return e.Error()
	}
	return "nri-gpu: " + e.Source + ": " + e.Detail
}

// refusal makes the error for r: msg writes the message with a function
// that describes holders, once as the pod sees them and once in full.
func refusal(r Request, msg func(describe func([]*Holding) string) string) *Error {
	ns := r.Holder.Namespace
	return &Error{Source: r.Source,
		Msg:    msg(func(hs []*Holding) string { return describe(hs, ns, true) }),
		Detail: msg(func(hs []*Holding) string { return describe(hs, ns, false) })}
}

// Table is the allocation table of a node. Its methods are safe for
// concurrent use; each is atomic, so concurrent requests never book the same
// GPU twice against the rules.
type Table struct {
	mu sync.Mutex
	// gpus are the indices of the node's GPUs, ascending.
	gpus []int
	// byGPU lists the holdings of each GPU, in the order they were made.
	byGPU map[int][]*Holding
	// byID finds a container's holding.
	byID map[string]*Holding
	// unhealthy are the units count requests skip, with why.
	unhealthy map[int]string
	// replicated are the units the device plugin hands out as replicas
	// (SetReplicated), with what they are shared as.
	replicated map[int]string
}

// New returns an empty table for the GPUs of the given indices.
func New(gpus []int) *Table {
	t := &Table{}
	t.SetGPUs(gpus)
	t.reset()
	return t
}

func (t *Table) reset() {
	t.byGPU = map[int][]*Holding{}
	t.byID = map[string]*Holding{}
}

// SetGPUs replaces the set of GPUs count requests pick from (after a new
// inventory); holdings stay.
func (t *Table) SetGPUs(gpus []int) {
	g := slices.Clone(gpus)
	slices.Sort(g)
	g = slices.Compact(g)
	t.mu.Lock()
	t.gpus = g
	t.mu.Unlock()
}

// SetUnhealthy replaces the set of unhealthy units (GPU indexes, MIG
// keys) with why: count requests skip them; holdings stay.
func (t *Table) SetUnhealthy(bad map[int]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unhealthy = bad
}

// SetReplicated replaces the set of units (GPU indexes, MIG keys) that
// the kubelet device plugin hands out as replicas (devicePlugin.sharing),
// with what each is shared as, for messages ("4 time-slicing replicas of
// nvidia.com/gpu"). Such a unit is shared by construction, whatever the
// mode of the requests that name it: the kubelet hands out its replicas
// by its own count, and every holding of it is shared. So a count request
// never gets it, a request for it by name is refused unless the runtime
// gave it (Request.Runtime, Request.Kubelet: its replicas), and no one
// holds it exclusively. Holdings stay.
func (t *Table) SetReplicated(r map[int]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.replicated = r
}

// Allocate books GPUs for r.Holder and returns their indices, ascending. A
// count request takes GPUs that no holder has exclusively (free ones for an
// exclusive request), the least shared first, ties by index. A request for
// named GPUs fails when one of them is held exclusively by another
// container, or, when the request is exclusive, held at all. A holder that
// already holds GPUs (a repeated request for the same container ID) gives
// them up first.
func (t *Table) Allocate(r Request) ([]int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.allocate(r)
}

func (t *Table) allocate(r Request) ([]int, error) {
	if err := t.replicas(r); err != nil {
		return nil, err
	}
	old := t.byID[r.Holder.ID]
	if old != nil {
		t.remove(old)
	}
	gpus, err := t.pick(r)
	if err == nil {
		err = t.claimed(r, gpus)
	}
	if err != nil {
		if old != nil {
			t.add(old)
		}
		return nil, err
	}
	t.add(&Holding{Holder: r.Holder, Mode: r.Mode, GPUs: gpus, Kubelet: r.Kubelet, Runtime: r.Runtime || r.Kubelet})
	return slices.Clone(gpus), nil
}

// Join books GPUs for r.Holder as Allocate does, unless the holder already
// holds some: then it returns those, changes nothing, and reports that it
// joined. A pod-level request books once for the pod this way, and every
// later container of the pod joins the pod's holding.
// The holding is returned as it is: its mode is the first request's.
func (t *Table) Join(r Request) (Holding, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.byID[r.Holder.ID]; old != nil {
		if r.Member != "" && !slices.Contains(old.Members, r.Member) {
			old.Members = append(old.Members, r.Member)
		}
		return Holding{Holder: old.Holder, Mode: old.Mode, GPUs: slices.Clone(old.GPUs)}, true, nil
	}
	gpus, err := t.allocate(r)
	if err != nil {
		return Holding{}, false, err
	}
	if r.Member != "" {
		t.byID[r.Holder.ID].Members = []string{r.Member}
	}
	return Holding{Holder: r.Holder, Mode: r.Mode, GPUs: gpus}, false, nil
}

// Leave takes the container with the given ID out of the pods' holdings
// it shares (Join), and releases a pod's holding that it was the last
// member of: a pod whose only container asking was removed (a creation
// the runtime undid) holds nothing. It reports whether a holding went.
// A container's stop does not leave: an init container stops before the
// pod's next container joins.
func (t *Table) Leave(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	gone := false
	for _, h := range t.byID {
		if len(h.Members) == 0 || !slices.Contains(h.Members, id) {
			continue
		}
		h.Members = slices.DeleteFunc(h.Members, func(m string) bool { return m == id })
		if len(h.Members) == 0 {
			t.remove(h)
			gone = true
		}
	}
	return gone
}

// replicas refuses a request that names a unit shared as replicas
// (SetReplicated) without the runtime's or the kubelet's gift of it: such
// a unit is handed out only as the device plugin's replicas, never whole.
func (t *Table) replicas(r Request) error {
	if r.Runtime || r.Kubelet || r.Count > 0 {
		return nil
	}
	for _, g := range r.GPUs {
		if as := t.replicated[g]; as != "" {
			return refusal(r, func(func([]*Holding) string) string {
				return fmt.Sprintf("%s %s is shared as %s (devicePlugin.sharing): it is handed out only as the device plugin's replicas, never whole or exclusively",
					inventory.UnitKind(g), inventory.UnitLabel(g), as)
			})
		}
	}
	return nil
}

// claimed refuses a request of a holder that is not a claim for a GPU
// that a Dynamic Resource Allocation claim holds (ClaimHolder), in any
// mode: a claim's GPU is reached only through its claim. Memory shares of
// a GPU (claims booked shared) are the scheduler's accounting of it, and
// their containers are clients of its MPS daemon, held to their share; a
// node-local request beside them would be neither. (A count never gets a
// claim's GPU: it is the runtime's, countable. An adminAccess device is
// held by no claim.)
func (t *Table) claimed(r Request, gpus []int) error {
	if strings.HasPrefix(r.Holder.ID, ClaimHolderPrefix) {
		return nil
	}
	for _, g := range gpus {
		if !slices.ContainsFunc(t.byGPU[g], isClaim) {
			continue
		}
		hs := slices.DeleteFunc(slices.Clone(t.byGPU[g]), func(h *Holding) bool { return !isClaim(h) })
		return refusal(r, func(d func([]*Holding) string) string {
			return fmt.Sprintf("%s %s is held by %s: a GPU that a ResourceClaim holds is reached only through that claim", inventory.UnitKind(g), inventory.UnitLabel(g), d(hs))
		})
	}
	return nil
}

// isClaim reports whether h is a claim's holding (ClaimHolder).
func isClaim(h *Holding) bool { return strings.HasPrefix(h.Holder.ID, ClaimHolderPrefix) }

// Check returns the error Allocate(r) would return, without booking: nil
// when the request could be met now. A management container, which sees
// every GPU without holding one, is checked this way in shared mode, so
// that it cannot reach a GPU another container holds exclusively. (It may
// see units shared as replicas: it holds none.)
func (t *Table) Check(r Request) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, err := t.pick(r); err != nil {
		return err
	}
	return nil
}

// usable reports whether a request in mode m may use a GPU with holdings hs.
func usable(m sharing.Mode, hs []*Holding) bool {
	if m == sharing.Exclusive {
		return len(hs) == 0
	}
	return !anyExclusive(hs)
}

// countable reports whether a count request in mode m may be given a GPU
// with holdings hs: usable, and given to no container by the runtime.
func countable(m sharing.Mode, hs []*Holding) bool {
	return usable(m, hs) && !slices.ContainsFunc(hs, func(h *Holding) bool { return h.Runtime || h.Kubelet })
}

func anyExclusive(hs []*Holding) bool {
	for _, h := range hs {
		if h.Mode == sharing.Exclusive {
			return true
		}
	}
	return false
}

func (t *Table) pick(r Request) ([]int, error) {
	if r.Count <= 0 {
		gpus := slices.Clone(r.GPUs)
		slices.Sort(gpus)
		gpus = slices.Compact(gpus)
		for _, g := range gpus {
			hs := t.byGPU[g]
			if t.replicated[g] != "" || usable(r.Mode, hs) {
				// Replicas: every holding is shared (SetReplicated).
				continue
			}
			if r.Mode == sharing.Exclusive {
				return nil, refusal(r, func(d func([]*Holding) string) string {
					return fmt.Sprintf("%s %s cannot be held exclusively: it is held by %s", inventory.UnitKind(g), inventory.UnitLabel(g), d(hs))
				})
			}
			return nil, refusal(r, func(d func([]*Holding) string) string {
				return fmt.Sprintf("%s %s is held exclusively by %s", inventory.UnitKind(g), inventory.UnitLabel(g), d(hs))
			})
		}
		return gpus, nil
	}
	var cands []int
	for _, g := range t.gpus {
		// A count asks for whole GPUs: MIG devices are named, and
		// replicas are the device plugin's.
		if inventory.IsMIGKey(g) || t.unhealthy[g] != "" || t.replicated[g] != "" {
			continue
		}
		if countable(r.Mode, t.byGPU[g]) {
			cands = append(cands, g)
		}
	}
	if len(cands) < r.Count {
		return nil, refusal(r, func(d func([]*Holding) string) string { return t.shortage(r, len(cands), d) })
	}
	sort.SliceStable(cands, func(i, j int) bool { return len(t.byGPU[cands[i]]) < len(t.byGPU[cands[j]]) })
	gpus := cands[:r.Count:r.Count]
	slices.Sort(gpus)
	return gpus, nil
}

// shortage says why a count request cannot be met: how many GPUs it could
// have, and who holds the others.
func (t *Table) shortage(r Request, usableN int, describe func([]*Holding) string) string {
	var b strings.Builder
	what := "free or shared"
	if r.Mode == sharing.Exclusive {
		what = "free"
	}
	n := strconv.Itoa(r.Count) + " GPUs"
	if r.Count == 1 {
		n = "1 GPU"
	}
	whole := 0
	for _, g := range t.gpus {
		if !inventory.IsMIGKey(g) {
			whole++
		}
	}
	fmt.Fprintf(&b, "%s request for %s cannot be met: %d of the node's %d GPUs are %s", r.Mode, n, usableN, whole, what)
	var held, bad, replicas []string
	for _, g := range t.gpus {
		hs := t.byGPU[g]
		if why := t.unhealthy[g]; why != "" && !inventory.IsMIGKey(g) {
			bad = append(bad, fmt.Sprintf("GPU %d: %s", g, why))
			continue
		}
		if as := t.replicated[g]; as != "" && !inventory.IsMIGKey(g) {
			replicas = append(replicas, fmt.Sprintf("GPU %d: %s", g, as))
			continue
		}
		if countable(r.Mode, hs) || inventory.IsMIGKey(g) {
			continue
		}
		given := ""
		if usable(r.Mode, hs) {
			given = ", given by the runtime"
		}
		held = append(held, fmt.Sprintf("GPU %d: %s%s", g, describe(hs), given))
	}
	if len(held) > 0 {
		b.WriteString("; held: ")
		b.WriteString(strings.Join(held, "; "))
	}
	if len(bad) > 0 {
		b.WriteString("; unhealthy: ")
		b.WriteString(strings.Join(bad, "; "))
	}
	if len(replicas) > 0 {
		b.WriteString("; shared as the device plugin's replicas: ")
		b.WriteString(strings.Join(replicas, "; "))
	}
	return b.String()
}

// describe lists the holders of a GPU: "default/train/main (exclusive)".
// With redact, holders outside namespace ns are not named: "a pod in
// another namespace (exclusive)", or "3 pods in other namespaces
// (shared)", after those named.
func describe(hs []*Holding, ns string, redact bool) string {
	s := make([]string, 0, len(hs))
	var others [2]int // by mode
	for _, h := range hs {
		if redact && h.Holder.Namespace != ns && h.Holder.ID != UnknownClaimsID {
			others[h.Mode]++
			continue
		}
		s = append(s, h.Holder.String()+" ("+h.Mode.String()+")")
	}
	for _, m := range []sharing.Mode{sharing.Exclusive, sharing.Shared} {
		switch n := others[m]; {
		case n == 1:
			s = append(s, "a pod in another namespace ("+m.String()+")")
		case n > 1:
			s = append(s, strconv.Itoa(n)+" pods in other namespaces ("+m.String()+")")
		}
	}
	return strings.Join(s, ", ")
}

func (t *Table) add(h *Holding) {
	t.byID[h.Holder.ID] = h
	for _, g := range h.GPUs {
		t.byGPU[g] = append(t.byGPU[g], h)
	}
}

func (t *Table) remove(h *Holding) {
	delete(t.byID, h.Holder.ID)
	for _, g := range h.GPUs {
		hs := slices.DeleteFunc(t.byGPU[g], func(x *Holding) bool { return x == h })
		// An inventory GPU keeps its emptied list, and its capacity, for
		// the next holder: booking is on the request path.
		if len(hs) == 0 && !slices.Contains(t.gpus, g) {
			delete(t.byGPU, g)
		} else {
			t.byGPU[g] = hs
		}
	}
}

// Release gives up the GPUs of the container with the given ID and reports
// whether it held any.
func (t *Table) Release(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.byID[id]
	if h == nil {
		return false
	}
	t.remove(h)
	return true
}

// ReleasePod gives up the GPUs of every container of the pod with the given
// sandbox ID and returns how many containers held some.
func (t *Table) ReleasePod(podID string) int {
	if podID == "" {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, h := range t.byID {
		if h.Holder.PodID == podID {
			t.remove(h)
			n++
		}
	}
	return n
}

// Rebuild replaces every holding with the given ones (what the runtime's
// containers hold), as they are: holdings that break the rules (two
// exclusive holders of a GPU, made by someone else) are kept, since they
// are the truth, and make the GPU unusable for new requests until released.
func (t *Table) Rebuild(hs []Holding) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reset()
	for i := range hs {
		h := hs[i]
		h.Members = slices.Clone(h.Members)
		h.GPUs = slices.Clone(h.GPUs)
		slices.Sort(h.GPUs)
		h.GPUs = slices.Compact(h.GPUs)
		if old := t.byID[h.Holder.ID]; old != nil {
			t.remove(old)
		}
		t.add(&h)
	}
}

// SyncClaims makes the claims' holdings (those whose holder ID starts
// with ClaimHolderPrefix) hs, in one atomic step: a claim's holding that
// hs lacks is released (its claim was unprepared, or dropped as stale),
// one that hs has and the table lacks is added, as it is (the scheduler
// allocated it: the truth, as for Rebuild). The holding of claim must,
// when given (a claim being prepared), is checked as a request once the
// claims that hs lacks are gone: when another holder has one of its GPUs
// exclusively, or it is exclusive and another holds one, nothing changes
// and the error says who holds it.
func (t *Table) SyncClaims(hs []Holding, must string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	want := make(map[string]bool, len(hs))
	for _, h := range hs {
		want[h.Holder.ID] = true
	}
	var gone []*Holding
	for id, h := range t.byID {
		if strings.HasPrefix(id, ClaimHolderPrefix) && !want[id] {
			gone = append(gone, h)
			t.remove(h)
		}
	}
	for _, h := range hs {
		if h.Holder.ID != must || t.byID[must] != nil {
			continue
		}
		if _, err := t.pick(Request{Holder: h.Holder, Mode: h.Mode, GPUs: h.GPUs, Source: h.Holder.String()}); err != nil {
			for _, g := range gone {
				t.add(g)
			}
			return err
		}
	}
	for i := range hs {
		if t.byID[hs[i].Holder.ID] != nil {
			continue
		}
		h := hs[i]
		h.GPUs = slices.Clone(h.GPUs)
		slices.Sort(h.GPUs)
		h.GPUs = slices.Compact(h.GPUs)
		h.Members = nil
		t.add(&h)
	}
	return nil
}

// GPUState is one row of the table.
type GPUState struct {
	Index int `json:"index"`
	// Mode is "free", "shared" or "exclusive".
	Mode    string        `json:"mode"`
	Holders []HolderState `json:"holders"`
	// Unhealthy says why the unit is unhealthy (count requests skip
	// it); empty when healthy.
	Unhealthy string `json:"unhealthy,omitempty"`
	// Replicated says what the unit is shared as when the device plugin
	// hands it out as replicas ("4 time-slicing replicas of
	// nvidia.com/gpu", SetReplicated): every holding of it is shared.
	Replicated string `json:"replicated,omitempty"`
}

// HolderState is a holder of a GPU and how it holds it.
type HolderState struct {
	Holder
	Mode string `json:"mode"`
	// Kubelet is set when the holding is the kubelet's assignment
	// (Holding.Kubelet).
	Kubelet bool `json:"kubelet,omitempty"`
	// Runtime is set when the runtime gave the holder the GPU
	// (Holding.Runtime): the kubelet's assignment through any device
	// plugin's device nodes, --device, CDI devices.
	Runtime bool `json:"runtime,omitempty"`
}

// State returns the table: one row per GPU of the node, ascending, then one
// per GPU held but no longer in the inventory.
func (t *Table) State() []GPUState {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := slices.Clone(t.gpus)
	for g := range t.byGPU {
		if !slices.Contains(t.gpus, g) {
			idx = append(idx, g)
		}
	}
	slices.Sort(idx)
	rows := make([]GPUState, 0, len(idx))
	for _, g := range idx {
		row := GPUState{Index: g, Mode: "free", Holders: []HolderState{}, Unhealthy: t.unhealthy[g], Replicated: t.replicated[g]}
		hs := t.byGPU[g]
		for _, h := range hs {
			m := h.Mode
			if row.Replicated != "" {
				m = sharing.Shared // replicas: every holding is shared
			}
			row.Holders = append(row.Holders, HolderState{Holder: h.Holder, Mode: m.String(), Kubelet: h.Kubelet, Runtime: h.Runtime || h.Kubelet})
		}
		switch {
		case anyExclusive(hs) && row.Replicated == "":
			row.Mode = "exclusive"
		case len(hs) > 0:
			row.Mode = "shared"
		}
		rows = append(rows, row)
	}
	return rows
}

// Holdings returns every holding, ordered by container ID.
func (t *Table) Holdings() []Holding {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Holding, 0, len(t.byID))
	for _, h := range t.byID {
		out = append(out, Holding{Holder: h.Holder, Mode: h.Mode, GPUs: slices.Clone(h.GPUs), Kubelet: h.Kubelet, Runtime: h.Runtime})
	}
	slices.SortFunc(out, func(a, b Holding) int { return strings.Compare(a.Holder.ID, b.Holder.ID) })
	return out
}

// Summary is the table in one line, for the log:
// "0=exclusive[default/a/main] 1=shared[default/b/x,default/c/y] 2=free";
// a holder whose GPUs the kubelet assigned is marked "kubelet:"
// ("3=shared[kubelet:default/d/main]"), a unit shared as replicas
// "(replicas)" ("4=shared(replicas)[kubelet:default/e/main]").
func Summary(rows []GPUState) string {
	var b strings.Builder
	for i, r := range rows {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(inventory.UnitLabel(r.Index))
		b.WriteByte('=')
		b.WriteString(r.Mode)
		if r.Unhealthy != "" {
			b.WriteString("(unhealthy)")
		}
		if r.Replicated != "" {
			b.WriteString("(replicas)")
		}
		if len(r.Holders) > 0 {
			b.WriteByte('[')
			for j, h := range r.Holders {
				if j > 0 {
					b.WriteByte(',')
				}
				if h.Kubelet {
					b.WriteString("kubelet:")
				}
				b.WriteString(h.String())
			}
			b.WriteByte(']')
		}
	}
	return b.String()
}
