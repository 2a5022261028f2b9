//go:build amd64 || arm64

package fairqueue

import (
	"testing"
	"unsafe"
)

// TestHotLayout keeps the cache-line layout BenchmarkCycle depends on: with
// 100k tenants every line a request touches is a miss, so the fields each
// step reads sit together, and each struct's size is a Go size class whose
// objects start on a 64-byte line (128, 192, 256), so that the lines stay
// where the layout puts them. A field added in the wrong place fails here,
// not silently in a benchmark. The sizes are those of 64-bit pointers.
func TestHotLayout(t *testing.T) {
	const line = 64
	type field struct {
		name      string
		off, size uintptr
		line      int // the line it must lie in
	}
	var (
		tn tenant
		f  flow
		tk Ticket
	)
	for _, c := range []struct {
		name   string
		size   uintptr
		class  uintptr // the size class the objects are allocated in
		fields []field
	}{
		{"tenant", unsafe.Sizeof(tn), 256, []field{
			{"group", unsafe.Offsetof(tn.group), 8, 0}, {"cfg", unsafe.Offsetof(tn.cfg), 8, 0},
			{"flowBuf", unsafe.Offsetof(tn.flowBuf), 8, 0}, {"queued", unsafe.Offsetof(tn.queued), 8, 0},
			{"inflight", unsafe.Offsetof(tn.inflight), 8, 0}, {"queuedWork", unsafe.Offsetof(tn.queuedWork), 8, 0},
			{"known", unsafe.Offsetof(tn.known), 1, 0}, {"out", unsafe.Offsetof(tn.out), 1, 0},
			{"vt", unsafe.Offsetof(tn.vt), 8, 1}, {"weight", unsafe.Offsetof(tn.weight), 8, 1},
			{"flows", unsafe.Offsetof(tn.flows), 24, 1},
		}},
		{"flow", unsafe.Sizeof(f), 192, []field{
			{"t", unsafe.Offsetof(f.t), 8, 0}, {"q", unsafe.Offsetof(f.q), 24, 0},
			{"cq", unsafe.Offsetof(f.cq), 8, 0}, {"in", unsafe.Offsetof(f.in), 8, 0},
			{"out", unsafe.Offsetof(f.out), 8, 0}, {"id", unsafe.Offsetof(f.id), 4, 0},
			{"group", unsafe.Offsetof(f.group), 1, 0},
		}},
		{"Ticket", unsafe.Sizeof(tk), 192, []field{
			{"t", unsafe.Offsetof(tk.t), 8, 0}, {"f", unsafe.Offsetof(tk.f), 8, 0},
			{"next", unsafe.Offsetof(tk.next), 8, 0}, {"cost", unsafe.Offsetof(tk.cost), 8, 0},
			{"tokens", unsafe.Offsetof(tk.tokens), 8, 0}, {"state", unsafe.Offsetof(tk.state), 1, 0},
			{"fallback", unsafe.Offsetof(tk.fallback), 1, 0}, {"deadline", unsafe.Offsetof(tk.deadline), 24, 1},
			{"dispatched", unsafe.Offsetof(tk.dispatched), 8, 1}, {"ready", unsafe.Offsetof(tk.ready), 8, 1},
			{"bytes", unsafe.Offsetof(tk.bytes), 8, 1}, {"ch", unsafe.Offsetof(tk.ch), 8, 1},
			{"actual", unsafe.Offsetof(tk.actual), 8, 1},
		}},
	} {
		if c.size > c.class || c.size <= c.class-16 {
			t.Errorf("%s is %d bytes; its layout is made for the %d-byte size class", c.name, c.size, c.class)
		}
		for _, fl := range c.fields {
			if first, last := int(fl.off/line), int((fl.off+fl.size-1)/line); first != fl.line || last != fl.line {
				t.Errorf("%s.%s spans lines %d-%d, want line %d", c.name, fl.name, first, last, fl.line)
			}
		}
	}
}
