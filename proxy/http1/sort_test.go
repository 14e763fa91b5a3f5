package http1

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// TestSortFields: the answer's headers come out in name order whatever their number (the
// insertion sort up to 32, slices.SortFunc past it) and order.
func TestSortFields(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 5, 12, 32, 33, 80} {
		for range 20 {
			var f []headerField
			var keys []string
			for i := range n {
				k := "X-H-" + strconv.Itoa(rng.IntN(50)) + "-" + strconv.Itoa(i)
				f = append(f, headerField{k: k, vv: []string{k}})
				keys = append(keys, k)
			}
			sortFields(f)
			slices.Sort(keys)
			for i := range f {
				if f[i].k != keys[i] || f[i].vv[0] != keys[i] {
					t.Fatalf("n=%d: position %d holds %q, want %q", n, i, f[i].k, keys[i])
				}
			}
		}
	}
}
