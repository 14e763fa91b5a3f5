package manifests

import (
	"fmt"
	"strings"
)

// firstDiff shows the first line where two texts differ, with its neighbours.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < max(len(al), len(bl)); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y || i >= len(al) || i >= len(bl) {
			return fmt.Sprintf("line %d:\n  checked in: %q\n  rendered:   %q", i+1, x, y)
		}
	}
	return "no difference"
}
