package fairqueue

import (
	"cmp"
	"math"
	"slices"
)

// The work-ahead index: what the admission ETA (workAheadLocked) needs of
// the other tenants, in O(log n) per ETA rather than a walk over every
// backlogged flow.
//
// For a request whose virtual finish tag is f, another backlogged tenant u
// (weight w, virtual time vt, queuedWork c) is dispatched first up to
//
//	min(max((f - vt) w, 0), c) = w max(f - vt, 0) - w max(f - F, 0)
//
// where F = vt + c/w is the virtual time at which u's queue would be
// drained (both sides are 0 below vt, grow as w(f - vt) up to F, and stay
// at c above it). Summed over the tenants,
//
//	(f W1 - S1) - (f W2 - S2)
//
// with W1, S1 the sums of w and w vt over the tenants whose vt < f, and
// W2, S2 the same over those whose F < f. Two treaps per set of tenants,
// one ordered by vt and one by F, each node holding its subtree's sums of
// w and w x key, answer that in one descent each: O(log n).
//
// Which tenants count is what the walk over the heaps decides
// (othersWalkLocked). Tenants are filed by tier: tierFirst (the first flow
// the walk visits is in an unpaused class), tierLater (an unpaused flow, but
// the first visited is paused), tierPaused (paused flows only). Changes mark
// a tenant (aheadTouchLocked) and the next ETA re-files the marked ones;
// a reload or an empty queue drops the index, rebuilt in bulk when next
// needed. Keys are relative to the level's virtual time at the build.

// Tiers of the work-ahead index; tierNone, the zero value: not backlogged
// in any heap (tiers[tierNone] stays empty).
const (
	tierNone int8 = iota
	tierFirst
	tierLater
	tierPaused
	numTiers
)

// Levels of the index: the top-level flow owners (declared tenants and the
// group), and the undeclared tenants inside the group.
const (
	levelTop = iota
	levelMembers
	numLevels
)

// aheadSlot is a tenant's place in the work-ahead index, valid while epoch
// is the index's.
type aheadSlot struct {
	epoch uint64
	// qw is the queued work filed with the tenant (tierFirst's total).
	qw int64
	// start is its node in the tier's vt treap; start+1 its node in the
	// F treap (nodes come in pairs, so the slot and the tenant stay small).
	start int32
	tier  int8
	dirty bool
}

// aheadNode is one treap node; node 0 is the empty tree, all zeros.
type aheadNode struct {
	key, w  float64
	sw, swk float64  // subtree sums of w and w x key
	kid     [2]int32 // left and right child, 0: none
	prio    uint32
}

// aheadTier is one tier of one level: the roots of its two treaps and the
// queued work filed in it.
type aheadTier struct {
	start, finish int32
	qw            int64
}

// aheadLevel is one level of the index.
type aheadLevel struct {
	tiers [numTiers]aheadTier
	// base is the level's virtual time when the index was built: keys
	// are stored relative to it.
	base float64
}

// aheadIndex is the queue's work-ahead index.
type aheadIndex struct {
	active bool
	epoch  uint64
	levels [numLevels]aheadLevel
	nodes  []aheadNode
	free   []int32 // the first nodes of free pairs
	// size is the tenants filed, dirty those marked since the last ETA.
	size  int
	dirty []*tenant
	rng   uint64
}

// aheadTouchLocked marks t, and the group of an undeclared t, for
// re-filing at the next ETA: call it after anything that may change a
// tenant's virtual time, queued work or backlogged flows.
func (q *Queue) aheadTouchLocked(t *tenant) {
	x := &q.adm.ahead
	if !x.active {
		return
	}
	if q.queued == 0 {
		// Nothing is backlogged: the index is empty, and the next ETA
		// builds it from what is queued then.
		x.reset()
		return
	}
	x.touch(t)
	if t.group != nil {
		x.touch(t.group)
	}
	if len(x.dirty) > max(1024, 2*x.size) {
		// No ETA for a while: stop keeping the index rather than let the
		// marks pile up; the next ETA rebuilds it.
		x.reset()
	}
}

// touch marks t; a slot of an older epoch is stale and starts empty.
func (x *aheadIndex) touch(t *tenant) {
	s := &t.ahead
	if s.epoch != x.epoch {
		*s = aheadSlot{epoch: x.epoch}
	}
	if !s.dirty {
		s.dirty = true
		x.dirty = append(x.dirty, t)
	}
}

// aheadPausedLocked re-files, at the next ETA, the tenants whose tier a
// change of cq's pause may change: those with a flow in its heap or in the
// group's flow of cq. When they are more than half the index, the index is
// dropped instead: a build in bulk is then cheaper.
func (q *Queue) aheadPausedLocked(cq *classQ) {
	x := &q.adm.ahead
	if !x.active {
		return
	}
	gf := cq.group
	n := cq.flows.len()
	if gf != nil {
		n += gf.sub.len()
	}
	if n > x.size/2 {
		x.reset()
		return
	}
	x.touchHeap(&cq.flows)
	if gf != nil {
		x.touchHeap(gf.sub)
	}
}

// touchHeap marks the owners of the flows in h.
func (x *aheadIndex) touchHeap(h *flowHeap) {
	for i := range h.e {
		x.touch(h.flow(&h.e[i]).t)
	}
}

// reset drops the index: a new epoch makes every tenant's slot stale, so
// nothing need visit the tenants.
func (x *aheadIndex) reset() {
	if !x.active && len(x.dirty) == 0 && len(x.nodes) <= 1 {
		return
	}
	x.active = false
	x.epoch++
	x.levels = [numLevels]aheadLevel{}
	x.size = 0
	clear(x.dirty)
	if cap(x.nodes) > aheadKeepNodes {
		// Memory follows the backlog.
		x.nodes, x.free, x.dirty = nil, nil, nil
		return
	}
	x.nodes = x.nodes[:0]
	x.free = x.free[:0]
	x.dirty = x.dirty[:0]
}

// aheadKeepNodes is the most nodes whose memory the index keeps for reuse
// once dropped (192 KiB).
const aheadKeepNodes = 4096

// aheadSyncLocked brings the index up to date for an ETA: it builds it
// from the heaps when it is not kept, and re-files the marked tenants.
func (q *Queue) aheadSyncLocked() {
	x := &q.adm.ahead
	if !x.active {
		x.reset()
		x.active = true
		if x.rng == 0 {
			x.rng = 0x9e3779b97f4a7c15
		}
		x.nodes = append(x.nodes, aheadNode{}) // node 0: the empty tree
		x.levels[levelTop].base = q.vfloor
		x.levels[levelMembers].base = q.group.vfloor
		// The tenants the walk would visit: the owners of the flows in
		// the classes' heaps, and the members in the group flows' heaps.
		for _, cq := range q.classes {
			x.touchHeap(&cq.flows)
		}
		for _, gf := range q.group.flows {
			x.touchHeap(gf.sub)
		}
		q.aheadBuildLocked()
		return
	}
	for i, t := range x.dirty {
		x.dirty[i] = nil
		// A tenant forgotten since it was marked has nothing queued: this
		// takes it out of the index.
		if s := &t.ahead; s.epoch == x.epoch && s.dirty {
			q.aheadFileLocked(t)
		}
	}
	x.dirty = x.dirty[:0]
}

// aheadBuildLocked files the marked tenants into an empty index in bulk:
// it sorts each tier's keys and builds balanced treaps from them, O(F log
// F) for F tenants, several times faster than F insertions.
func (q *Queue) aheadBuildLocked() {
	x := &q.adm.ahead
	// First the tiers, to size the arrays; then the nodes.
	var count [numLevels][numTiers]int
	for _, t := range x.dirty {
		s := &t.ahead
		s.tier = q.aheadTierLocked(t)
		count[levelOf(t)][s.tier]++
	}
	x.nodes = slices.Grow(x.nodes, 2*len(x.dirty))
	var keys [numLevels][numTiers][]aheadKey
	for lv := range keys {
		for tier := tierFirst; tier < numTiers; tier++ {
			keys[lv][tier] = make([]aheadKey, 0, count[lv][tier])
		}
	}
	for i, t := range x.dirty {
		x.dirty[i] = nil
		s := &t.ahead
		s.dirty = false
		if s.tier == tierNone {
			continue
		}
		lv := levelOf(t)
		vt := t.vt - x.levels[lv].base
		fin := vt + float64(t.queuedWork)/t.weight
		s.qw = t.queuedWork
		s.start = x.newPair(vt, fin, t.weight)
		keys[lv][s.tier] = append(keys[lv][s.tier], aheadKey{vt, s.start})
		x.levels[lv].tiers[s.tier].qw += s.qw
		x.size++
	}
	x.dirty = x.dirty[:0]
	for lv := range keys {
		for tier, ks := range keys[lv] {
			if len(ks) == 0 {
				continue
			}
			tr := &x.levels[lv].tiers[tier]
			tr.start = x.build(ks)
			for i := range ks {
				ks[i] = aheadKey{x.nodes[ks[i].id+1].key, ks[i].id + 1}
			}
			tr.finish = x.build(ks)
		}
	}
}

// aheadKey is a node's key and id, sorted by aheadBuildLocked.
type aheadKey struct {
	key float64
	id  int32
}

// build links the nodes of ks into a balanced treap and returns its root.
// The priorities are drawn anew and handed out in decreasing order level
// by level, so the heap order holds.
func (x *aheadIndex) build(ks []aheadKey) int32 {
	slices.SortFunc(ks, func(a, b aheadKey) int { return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.id, b.id)) })
	prios := make([]uint32, len(ks))
	for i := range prios {
		prios[i] = x.prio()
	}
	slices.Sort(prios)
	// Breadth first over the ranges of ks, each node the middle of its
	// range: parents come before their children.
	type span struct{ lo, hi, parent int32 }
	order := make([]int32, 0, len(ks))
	queue := make([]span, 1, len(ks)) // each node's range is queued once
	queue[0] = span{0, int32(len(ks)), -1}
	n := x.nodes
	for head := 0; head < len(queue); head++ {
		sp := queue[head]
		mid := (sp.lo + sp.hi) / 2
		id := ks[mid].id
		e := &n[id]
		e.kid = [2]int32{}
		e.prio = prios[len(prios)-1-len(order)]
		order = append(order, id)
		if sp.parent >= 0 {
			if p := ks[sp.parent].id; mid < sp.parent {
				n[p].kid[0] = id
			} else {
				n[p].kid[1] = id
			}
		}
		if sp.lo < mid {
			queue = append(queue, span{sp.lo, mid, mid})
		}
		if mid+1 < sp.hi {
			queue = append(queue, span{mid + 1, sp.hi, mid})
		}
	}
	for i := len(order) - 1; i >= 0; i-- {
		x.pull(order[i])
	}
	return order[0]
}

// levelOf is the level t is filed at.
func levelOf(t *tenant) int {
	if t.group != nil {
		return levelMembers
	}
	return levelTop
}

// aheadTierLocked is the tier t belongs in (see above).
func (q *Queue) aheadTierLocked(t *tenant) int8 {
	if t.queued == 0 {
		return tierNone // no flow has a head, so none is in a heap
	}
	first, firstPaused, unpaused := -1, false, false
	for _, f := range t.flows {
		if !f.heap().contains(f.id) {
			continue
		}
		if ord := q.aheadOrderLocked(f); first < 0 || ord < first {
			first, firstPaused = ord, f.cq.paused
		}
		if !f.cq.paused {
			unpaused = true
		}
	}
	switch {
	case first < 0:
		return tierNone
	case !unpaused:
		return tierPaused
	case firstPaused:
		return tierLater
	}
	return tierFirst
}

// aheadOrderLocked is where the walk visits f's heap: its class's place
// among the queue's classes, or, for a member's flow, its group flow's
// place among the group's flows.
func (q *Queue) aheadOrderLocked(f *flow) int {
	if p := f.parent(); p != nil {
		for i, gf := range p.t.flows {
			if gf == p {
				return i
			}
		}
		return len(p.t.flows)
	}
	for i, cq := range q.classes {
		if cq == f.cq {
			return i
		}
	}
	return len(q.classes)
}

// aheadFileLocked files the marked t where it now belongs.
func (q *Queue) aheadFileLocked(t *tenant) {
	x := &q.adm.ahead
	s := &t.ahead
	s.dirty = false
	lv := levelOf(t)
	tier := q.aheadTierLocked(t)
	if tier == tierNone {
		if s.tier != tierNone {
			x.unfile(lv, s)
		}
		return
	}
	vt := t.vt - x.levels[lv].base
	qw := t.queuedWork
	fin := vt + float64(qw)/t.weight
	tr := &x.levels[lv].tiers[tier]
	if s.tier == tier && x.nodes[s.start].w == t.weight {
		// Still in its tier: move the key that changed. A dispatch leaves
		// F = vt + c/w where it was up to rounding, not worth a move.
		if x.nodes[s.start].key != vt {
			tr.start = x.rekey(tr.start, s.start, vt)
		}
		if d := fin - x.nodes[s.start+1].key; d > finTolerance*(math.Abs(vt)+fin-vt) || -d > finTolerance*(math.Abs(vt)+fin-vt) {
			tr.finish = x.rekey(tr.finish, s.start+1, fin)
		}
		tr.qw += qw - s.qw
		s.qw = qw
		return
	}
	if s.tier != tierNone {
		x.unfile(lv, s)
	}
	s.tier, s.qw = tier, qw
	s.start = x.newPair(vt, fin, t.weight)
	tr.start = x.insert(tr.start, s.start)
	tr.finish = x.insert(tr.finish, s.start+1)
	tr.qw += qw
	x.size++
}

// finTolerance is how far, relative to |vt| + c/w, a tenant's filed F may
// be from the one its state gives before it is moved: rounding noise.
const finTolerance = 1e-14

// rekey moves node id of the treap root to key and returns the new root.
func (x *aheadIndex) rekey(root, id int32, key float64) int32 {
	root = x.remove(root, id)
	e := &x.nodes[id]
	e.key, e.kid = key, [2]int32{}
	e.sw, e.swk = e.w, e.w*key
	return x.insert(root, id)
}

// unfile takes the tenant of slot s out of its tier at level lv.
func (x *aheadIndex) unfile(lv int, s *aheadSlot) {
	tr := &x.levels[lv].tiers[s.tier]
	tr.start = x.remove(tr.start, s.start)
	tr.finish = x.remove(tr.finish, s.start+1)
	tr.qw -= s.qw
	x.free = append(x.free, s.start)
	s.tier, s.start, s.qw = tierNone, 0, 0
	x.size--
}

// aheadOthersLocked is the work of the tenants at level lv other than self
// that a request with virtual finish tag f, of a paused class or not, has
// ahead of it (see above). The index must be in sync (aheadSyncLocked).
func (q *Queue) aheadOthersLocked(lv int, self *tenant, f float64, paused bool) float64 {
	x := &q.adm.ahead
	l := &x.levels[lv]
	f -= l.base
	var sum float64
	if paused {
		sum = float64(l.tiers[tierFirst].qw) + x.room(&l.tiers[tierLater], f) + x.room(&l.tiers[tierPaused], f)
	} else {
		sum = x.room(&l.tiers[tierFirst], f) + x.room(&l.tiers[tierLater], f)
	}
	if s := &self.ahead; s.epoch == x.epoch && s.tier != tierNone {
		switch {
		case paused && s.tier == tierFirst:
			sum -= float64(s.qw)
		case paused || s.tier != tierPaused:
			sum -= x.term(s, f)
		}
	}
	return max(sum, 0)
}

// room is the sum over a tier's tenants of min(max((f-vt)w, 0), c).
func (x *aheadIndex) room(tr *aheadTier, f float64) float64 {
	if tr.start == 0 {
		return 0
	}
	w1, s1 := x.below(tr.start, f)
	w2, s2 := x.below(tr.finish, f)
	return (f*w1 - s1) - (f*w2 - s2)
}

// term is one filed tenant's min(max((f-vt)w, 0), c).
func (x *aheadIndex) term(s *aheadSlot, f float64) float64 {
	a, b := &x.nodes[s.start], &x.nodes[s.start+1]
	return a.w*max(f-a.key, 0) - b.w*max(f-b.key, 0)
}

// below sums w and w x key over the nodes of the treap root whose key is
// below f.
func (x *aheadIndex) below(root int32, f float64) (sw, swk float64) {
	n := x.nodes
	for root != 0 {
		e := &n[root]
		if e.key < f {
			l := &n[e.kid[0]]
			sw += l.sw + e.w
			swk += l.swk + e.w*e.key
			root = e.kid[1]
		} else {
			root = e.kid[0]
		}
	}
	return sw, swk
}

// newPair allocates a tenant's two nodes, keyed vt and fin, of weight w.
func (x *aheadIndex) newPair(vt, fin, w float64) int32 {
	a := aheadNode{key: vt, w: w, sw: w, swk: w * vt, prio: x.prio()}
	b := aheadNode{key: fin, w: w, sw: w, swk: w * fin, prio: x.prio()}
	if n := len(x.free); n > 0 {
		id := x.free[n-1]
		x.free = x.free[:n-1]
		x.nodes[id], x.nodes[id+1] = a, b
		return id
	}
	x.nodes = append(x.nodes, a, b)
	return int32(len(x.nodes) - 2)
}

// prio draws a node's priority (xorshift64): priorities need only be
// independent of the keys.
func (x *aheadIndex) prio() uint32 {
	x.rng ^= x.rng << 13
	x.rng ^= x.rng >> 7
	x.rng ^= x.rng << 17
	return uint32(x.rng >> 32)
}

// side is the subtree of root that node id belongs in, 0 (left) or 1:
// nodes are ordered by key, then by id, so that equal keys are told apart.
func (x *aheadIndex) side(id, root int32) int {
	a, b := x.nodes[id].key, x.nodes[root].key
	if a < b || a == b && id < root {
		return 0
	}
	return 1
}

// pull recomputes node i's subtree sums from its children.
func (x *aheadIndex) pull(i int32) {
	n := x.nodes
	e := &n[i]
	l, r := &n[e.kid[0]], &n[e.kid[1]]
	e.sw = l.sw + e.w + r.sw
	e.swk = l.swk + e.w*e.key + r.swk
}

// insert adds node id to the treap root and returns the new root.
func (x *aheadIndex) insert(root, id int32) int32 {
	if root == 0 {
		return id
	}
	n := x.nodes
	d := x.side(id, root)
	c := x.insert(n[root].kid[d], id)
	n[root].kid[d] = c
	if n[c].prio > n[root].prio {
		// rotate c above root
		n[root].kid[d] = n[c].kid[1-d]
		x.pull(root)
		n[c].kid[1-d] = root
		x.pull(c)
		return c
	}
	x.pull(root)
	return root
}

// remove takes node id out of the treap root and returns the new root.
func (x *aheadIndex) remove(root, id int32) int32 {
	n := x.nodes
	if root == id {
		return x.merge(n[id].kid[0], n[id].kid[1])
	}
	if root == 0 {
		panic("fairqueue: work-ahead node not in its treap")
	}
	d := x.side(id, root)
	n[root].kid[d] = x.remove(n[root].kid[d], id)
	x.pull(root)
	return root
}

// merge joins two treaps, every key of a before every key of b.
func (x *aheadIndex) merge(a, b int32) int32 {
	if a == 0 {
		return b
	}
	if b == 0 {
		return a
	}
	n := x.nodes
	if n[a].prio > n[b].prio {
		n[a].kid[1] = x.merge(n[a].kid[1], b)
		x.pull(a)
		return a
	}
	n[b].kid[0] = x.merge(a, n[b].kid[0])
	x.pull(b)
	return b
}

// aheadWalkMax is the most backlogged flows for which an ETA walks them
// (othersWalkLocked) rather than keep the index.
const aheadWalkMax = 128

// aheadWalkLocked reports whether an ETA walks the backlogged flows rather
// than use the index: while they are at most walkMax, or, once the index
// is kept, half that, so that each build is paid for by at least walkMax/2
// flows' changes. Falling to half drops the index.
func (q *Queue) aheadWalkLocked() bool {
	x := &q.adm.ahead
	limit := q.adm.walkMax
	if x.active {
		limit /= 2
	}
	if limit < 0 {
		return false
	}
	n := 0
	for _, cq := range q.classes {
		n += cq.flows.len()
	}
	for _, gf := range q.group.flows {
		n += gf.sub.len()
	}
	if n > limit {
		return false
	}
	x.reset()
	return true
}
