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
	for _, c := range []struct {
		name string
		size uintptr
		max  uintptr // the size class the objects are allocated in
		hot  map[string][2]uintptr
		want map[string]int // the line each hot field must lie in
	}{
		{"tenant", unsafe.Sizeof(tenant{}), 256,
			map[string][2]uintptr{
				"group": {unsafe.Offsetof(tenant{}.group), 8}, "cfg": {unsafe.Offsetof(tenant{}.cfg), 8},
				"flowBuf": {unsafe.Offsetof(tenant{}.flowBuf), 8}, "queued": {unsafe.Offsetof(tenant{}.queued), 8},
				"inflight": {unsafe.Offsetof(tenant{}.inflight), 8}, "queuedWork": {unsafe.Offsetof(tenant{}.queuedWork), 8},
				"known": {unsafe.Offsetof(tenant{}.known), 1}, "out": {unsafe.Offsetof(tenant{}.out), 1},
				"vt": {unsafe.Offsetof(tenant{}.vt), 8}, "weight": {unsafe.Offsetof(tenant{}.weight), 8},
				"flows": {unsafe.Offsetof(tenant{}.flows), 24},
			},
			map[string]int{"group": 0, "cfg": 0, "flowBuf": 0, "queued": 0, "inflight": 0, "queuedWork": 0,
				"known": 0, "out": 0, "vt": 1, "weight": 1, "flows": 1}},
		{"flow", unsafe.Sizeof(flow{}), 192,
			map[string][2]uintptr{
				"t": {unsafe.Offsetof(flow{}.t), 8}, "q": {unsafe.Offsetof(flow{}.q), 24},
				"cq": {unsafe.Offsetof(flow{}.cq), 8}, "in": {unsafe.Offsetof(flow{}.in), 8},
				"out": {unsafe.Offsetof(flow{}.out), 8}, "id": {unsafe.Offsetof(flow{}.id), 4},
				"group": {unsafe.Offsetof(flow{}.group), 1},
			},
			map[string]int{"t": 0, "q": 0, "cq": 0, "in": 0, "out": 0, "id": 0, "group": 0}},
		{"Ticket", unsafe.Sizeof(Ticket{}), 192,
			map[string][2]uintptr{
				"t": {unsafe.Offsetof(Ticket{}.t), 8}, "f": {unsafe.Offsetof(Ticket{}.f), 8},
				"next": {unsafe.Offsetof(Ticket{}.next), 8}, "cost": {unsafe.Offsetof(Ticket{}.cost), 8},
				"tokens": {unsafe.Offsetof(Ticket{}.tokens), 8}, "state": {unsafe.Offsetof(Ticket{}.state), 1},
				"fallback": {unsafe.Offsetof(Ticket{}.fallback), 1}, "deadline": {unsafe.Offsetof(Ticket{}.deadline), 24},
				"dispatched": {unsafe.Offsetof(Ticket{}.dispatched), 8}, "ready": {unsafe.Offsetof(Ticket{}.ready), 8},
				"bytes": {unsafe.Offsetof(Ticket{}.bytes), 8}, "ch": {unsafe.Offsetof(Ticket{}.ch), 8},
				"actual": {unsafe.Offsetof(Ticket{}.actual), 8},
			},
			map[string]int{"t": 0, "f": 0, "next": 0, "cost": 0, "tokens": 0, "state": 0, "fallback": 0,
				"deadline": 1, "dispatched": 1, "ready": 1, "bytes": 1, "ch": 1, "actual": 1}},
	} {
		if c.size > c.max || c.size <= c.max-16 {
			t.Errorf("%s is %d bytes; its layout is made for the %d-byte size class", c.name, c.size, c.max)
		}
		for f, want := range c.want {
			off, n := c.hot[f][0], c.hot[f][1]
			if first, last := int(off/line), int((off+n-1)/line); first != want || last != want {
				t.Errorf("%s.%s spans lines %d-%d, want line %d", c.name, f, first, last, want)
			}
		}
	}
}
