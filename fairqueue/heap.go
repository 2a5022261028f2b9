package fairqueue

// deadlineEntry is one queued ticket with a deadline (Unix ns), copied so
// that ordering the heap reads only its own array.
type deadlineEntry struct {
	at int64
	tk *Ticket
}

// deadlineHeap is a binary min-heap (container/heap) of the queued tickets
// that have a deadline, earliest first; each ticket records its index
// (dlIdx) so that it can be removed in O(log n) when it leaves the queue.
type deadlineHeap []deadlineEntry

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].tk.dlIdx, h[j].tk.dlIdx = int32(i), int32(j)
}

// Push adds x, a *Ticket with a deadline.
func (h *deadlineHeap) Push(x any) {
	tk := x.(*Ticket)
	tk.dlIdx = int32(len(*h))
	*h = append(*h, deadlineEntry{at: tk.deadline.UnixNano(), tk: tk})
}

func (h *deadlineHeap) Pop() any {
	old := *h
	n := len(old) - 1
	tk := old[n].tk
	old[n] = deadlineEntry{}
	*h = old[:n]
	tk.dlIdx = -1
	return tk
}

// visitBefore calls fn for up to max tickets whose deadline is at or before
// limit, pruning subtrees whose root is later, so it costs O(visited).
func (h deadlineHeap) visitBefore(limit int64, max int, fn func(*Ticket)) {
	var walk func(i int)
	n := 0
	walk = func(i int) {
		if i >= len(h) || n >= max || h[i].at > limit {
			return
		}
		n++
		fn(h[i].tk)
		walk(2*i + 1)
		walk(2*i + 2)
	}
	walk(0)
}

// flowEntry is one backlogged flow in a class's heap. The tags are copied
// into the entry so that ordering the heap reads only the heap's own array,
// not the flows, tenants and tickets.
type flowEntry struct {
	start  float64 // the tenant's virtual time: the head request's start tag
	finish float64 // start + head cost / weight
	seq    uint64  // creation order of the flow, the last tie-breaker
	id     int32   // the flow's slot in flowHeap.pos and flowHeap.flows
}

// before orders entries by (finish, start, seq).
func (a *flowEntry) before(b *flowEntry) bool {
	if a.finish < b.finish {
		return true
	}
	if a.finish != b.finish {
		return false
	}
	if a.start < b.start {
		return true
	}
	if a.start != b.start {
		return false
	}
	return a.seq < b.seq
}

// flowArity is the flow heap's branching factor: a 4-ary heap is half as
// deep as a binary one.
const flowArity = 4

// flowHeap is a 4-ary min-heap of the backlogged flows of one class,
// ordered by (finish, start, seq). Each flow of the class has an id: flows[id]
// is the flow, pos[id] its index in e or -1 when it is not in the heap.
type flowHeap struct {
	e     []flowEntry
	pos   []int32
	flows []*flow
	free  []int32
}

func (h *flowHeap) len() int { return len(h.e) }

// top returns the smallest entry; the heap must not be empty.
func (h *flowHeap) top() *flowEntry { return &h.e[0] }

// flow returns the flow an entry stands for.
func (h *flowHeap) flow(e *flowEntry) *flow { return h.flows[e.id] }

// newID gives f, a new flow of the class, its slot.
func (h *flowHeap) newID(f *flow) int32 {
	if n := len(h.free); n > 0 {
		id := h.free[n-1]
		h.free = h.free[:n-1]
		h.pos[id], h.flows[id] = -1, f
		return id
	}
	h.pos = append(h.pos, -1)
	h.flows = append(h.flows, f)
	return int32(len(h.pos) - 1)
}

// freeID releases the slot of a forgotten flow, which is not in the heap.
// When no slot is in use any more the arrays go too.
func (h *flowHeap) freeID(id int32) {
	h.flows[id] = nil
	h.free = append(h.free, id)
	if len(h.free) == len(h.pos) {
		*h = flowHeap{}
	}
}

// contains reports whether the flow with id is in the heap.
func (h *flowHeap) contains(id int32) bool { return h.pos[id] >= 0 }

func (h *flowHeap) swap(i, j int) {
	e := h.e
	e[i], e[j] = e[j], e[i]
	h.pos[e[i].id] = int32(i)
	h.pos[e[j].id] = int32(j)
}

// push adds f, which must not be in the heap and must have a head ticket.
func (h *flowHeap) push(f *flow) {
	h.pos[f.id] = int32(len(h.e))
	h.e = append(h.e, f.entry())
	h.up(len(h.e) - 1)
}

// remove takes f out of the heap and reports whether it was there.
func (h *flowHeap) remove(f *flow) bool {
	i := int(h.pos[f.id])
	if i < 0 {
		return false
	}
	n := len(h.e) - 1
	if i != n {
		h.swap(i, n)
	}
	h.e[n] = flowEntry{}
	h.e = h.e[:n]
	h.pos[f.id] = -1
	if i != n {
		h.fix(i)
	}
	return true
}

// put pushes f, or re-keys it when it is in the heap already.
func (h *flowHeap) put(f *flow) {
	if h.contains(f.id) {
		h.rekey(f)
	} else {
		h.push(f)
	}
}

// rekey recomputes the tags of f and restores order; a flow not in the
// heap stays out.
func (h *flowHeap) rekey(f *flow) {
	i := int(h.pos[f.id])
	if i < 0 {
		return
	}
	// Only the tags change: seq stays in the entry.
	e := &h.e[i]
	e.start, e.finish = f.tags()
	h.fix(i)
}

// rebuild recomputes every key (weights changed) and re-heapifies.
func (h *flowHeap) rebuild() {
	for i := range h.e {
		h.e[i] = h.flows[h.e[i].id].entry()
	}
	if len(h.e) < 2 {
		return
	}
	for i := (len(h.e) - 2) / flowArity; i >= 0; i-- {
		h.down(i)
	}
}

// fix restores order after the entry at i changed.
func (h *flowHeap) fix(i int) {
	if i > 0 && h.e[i].before(&h.e[(i-1)/flowArity]) {
		h.up(i)
		return
	}
	h.down(i)
}

// up moves the entry at j0 up to its place, moving a hole.
func (h *flowHeap) up(j0 int) {
	e := h.e
	x := e[j0]
	j := j0
	for j > 0 {
		i := (j - 1) / flowArity
		if !x.before(&e[i]) {
			break
		}
		e[j] = e[i]
		h.pos[e[j].id] = int32(j)
		j = i
	}
	if j != j0 {
		e[j] = x
		h.pos[x.id] = int32(j)
	}
}

// down moves the entry at i0 down to its place, given that the subtrees
// below it are in order, and reports whether it moved. It walks a hole
// down the path of least children to a leaf, then moves the entry up from
// there (Floyd's bottom-up sift): every entry ends where the classic sift
// puts it, which matters because the refusal sweep and the ETA walks visit
// the heap in array order.
func (h *flowHeap) down(i0 int) bool {
	e, pos := h.e, h.pos
	n := len(e)
	x := e[i0]
	i := i0
	for {
		first := flowArity*i + 1
		if first >= n {
			break
		}
		j := first
		if first+flowArity <= n {
			g := e[first : first+flowArity : first+flowArity]
			k := 0
			if g[1].before(&g[0]) {
				k = 1
			}
			if g[2].before(&g[k]) {
				k = 2
			}
			if g[3].before(&g[k]) {
				k = 3
			}
			j += k
		} else {
			for c := first + 1; c < n; c++ {
				if e[c].before(&e[j]) {
					j = c
				}
			}
		}
		e[i] = e[j]
		pos[e[i].id] = int32(i)
		i = j
	}
	for i > i0 {
		p := (i - 1) / flowArity
		if !x.before(&e[p]) {
			break
		}
		e[i] = e[p]
		pos[e[i].id] = int32(i)
		i = p
	}
	e[i] = x
	pos[x.id] = int32(i)
	return i != i0
}
