package policy

import (
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	n, f, d, s := 0, 2.5, Duration(0), "set"
	Default(&n, 7)
	Default(&f, 9)
	Default(&d, Duration(time.Second))
	Default(&s, "other")
	if n != 7 || f != 2.5 || d.D() != time.Second || s != "set" {
		t.Fatalf("got %d %v %v %q: zero fields take the default, set ones stay", n, f, d.D(), s)
	}
}
