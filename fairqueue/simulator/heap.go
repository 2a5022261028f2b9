package simulator

// minHeap is a binary min-heap of values ordered by their less method. The
// simulator keeps events, slot-free limits and deadlines in it; it is a
// typed slice rather than container/heap so values are not boxed.
type minHeap[T interface{ less(T) bool }] []T

func (h *minHeap[T]) push(x T) {
	*h = append(*h, x)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

// pop removes and returns the least value; h must not be empty.
func (h *minHeap[T]) pop() T {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	var zero T
	s[n] = zero
	s = s[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && s[l].less(s[m]) {
			m = l
		}
		if l+1 < n && s[l+1].less(s[m]) {
			m = l + 1
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}
