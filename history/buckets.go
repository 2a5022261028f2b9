package history

import "math"

// NumBuckets is the number of wait histogram buckets: bucket 0 holds waits
// up to 1 ms, bucket i (1..NumBuckets-2) those up to BucketBound(i), a
// factor √2 above the one before, and the last one everything longer
// (above about 741 s, beyond any class's wait budget). A quantile read
// from them is within a factor √2 of the truth, and interpolated inside
// its bucket.
const NumBuckets = 41

// firstBound is bucket 0's upper bound, in seconds.
const firstBound = 0.001

var bounds = func() [NumBuckets - 1]float64 {
	var b [NumBuckets - 1]float64
	for i := range b {
		b[i] = firstBound * math.Pow(2, float64(i)/2)
	}
	return b
}()

// BucketBounds returns the buckets' upper bounds in seconds, one for each
// bucket but the last (unbounded).
func BucketBounds() []float64 { return bounds[:] }

// bucketOf returns the bucket of a wait of w seconds.
func bucketOf(w float64) int {
	if w <= firstBound {
		return 0
	}
	// The estimate from the logarithm is exact but for rounding at a
	// bound; the two comparisons settle it.
	i := int(math.Ceil(2 * math.Log2(w/firstBound)))
	i = min(max(i, 1), NumBuckets-1)
	if w <= bounds[i-1] {
		i--
	}
	if i < NumBuckets-1 && w > bounds[i] {
		i++
	}
	return i
}

// quantile reads quantile q (0..1) of the waits counted in h, in seconds:
// linear inside bucket 0, geometric inside the others, the lower bound of
// the overflow bucket. 0 when h is empty.
func quantile(h *[NumBuckets]uint64, q float64) float64 {
	var n uint64
	for _, c := range h {
		n += c
	}
	if n == 0 {
		return 0
	}
	rank := q * float64(n)
	var seen float64
	for i, c := range h {
		if c == 0 {
			continue
		}
		if seen+float64(c) < rank && i < NumBuckets-1 {
			seen += float64(c)
			continue
		}
		f := min(max((rank-seen)/float64(c), 0), 1)
		switch i {
		case 0:
			return f * firstBound
		case NumBuckets - 1:
			return bounds[NumBuckets-2]
		default:
			lo, hi := bounds[i-1], bounds[i]
			return lo * math.Pow(hi/lo, f)
		}
	}
	return bounds[NumBuckets-2]
}
