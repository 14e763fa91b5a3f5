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

func TestCheck(t *testing.T) {
	var c Check
	if c.Err() != nil {
		t.Fatal("an empty check has an error")
	}
	c.NonNegative("max", 1)
	c.NonNegativeDuration("wait", Duration(0))
	if c.Err() != nil {
		t.Fatalf("valid values gave %v", c.Err())
	}
	c.NonNegative("max", -1)
	c.NonNegativeDuration("wait", Duration(-time.Second))
	c.Add("x: %d", 3)
	want := "max must not be negative, got -1\nwait must not be negative, got -1s\nx: 3"
	if err := c.Err(); err == nil || err.Error() != want {
		t.Errorf("got %v, want every problem:\n%s", err, want)
	}
}
