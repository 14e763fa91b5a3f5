package heapfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name        string
		live, floor uint64
		want        int
	}{
		{"a small live heap: the runtime's minimum at the floor", 2 * mib, 16 * mib, 400},
		{"not yet known", 0, 16 * mib, 400},
		{"the live term reaches the floor first", 5 * mib, 16 * mib, 220},
		{"half the floor live: the runtime's own", 8 * mib, 16 * mib, 100},
		{"more live than the floor", 500 * mib, 16 * mib, 100},
		{"a larger floor", 2 * mib, 64 * mib, 1600},
		{"the live term under a larger floor", 20 * mib, 64 * mib, 220},
		{"a floor at the runtime's minimum changes nothing", 1 * mib, 4 * mib, 100},
		{"a floor below it neither", 1 * mib, 1 * mib, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percent(tc.live, tc.floor); got != tc.want {
				t.Errorf("Percent(%d MiB, %d MiB) = %d, want %d", tc.live/mib, tc.floor/mib, got, tc.want)
			}
			if tc.live > 0 && tc.floor > RuntimeMinimum {
				// The goal it gives: max(live × (1 + p/100), 4 MiB × p/100) is the floor or
				// twice the live heap, whichever is more (within rounding).
				p := uint64(Percent(tc.live, tc.floor))
				goal := max(tc.live*(100+p)/100, RuntimeMinimum*p/100)
				want := max(tc.floor, 2*tc.live)
				if goal > want+want/50 || goal < want-want/50 {
					t.Errorf("goal %d MiB, want about %d MiB", goal>>20, want>>20)
				}
			}
		})
	}
}

func gogc() int64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// waitGOGC collects until the GOGC is want (the finalizer runs after a collection, on the
// runtime's finalizer goroutine), for at most 5 s.
func waitGOGC(t *testing.T, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for gogc() != want {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC %d, want %d", gogc(), want)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

var keep []byte

func TestHold(t *testing.T) {
	t.Setenv("GOGC", "") // an operator's GOGC is tested below
	defer debug.SetGCPercent(debug.SetGCPercent(150))
	runtime.GC()

	release := Hold(16 << 20)
	waitGOGC(t, 400) // the test's live heap is far below 8 MiB

	// A live heap of 12 MiB: twice it is above the floor, the runtime's own GOGC.
	keep = make([]byte, 12<<20)
	waitGOGC(t, 100)
	keep = nil
	waitGOGC(t, 400)

	// A second holder with a higher floor: the higher counts while both hold.
	second := Hold(64 << 20)
	waitGOGC(t, 1600)
	second()
	second() // a second call does nothing
	waitGOGC(t, 400)

	release()
	if g := gogc(); g != 150 {
		t.Fatalf("after the last release GOGC %d, want 150 as before", g)
	}
	// The chain stops: collections after the release change nothing.
	for range 3 {
		runtime.GC()
	}
	time.Sleep(10 * time.Millisecond)
	if g := gogc(); g != 150 {
		t.Fatalf("collections after the release set GOGC %d, want 150", g)
	}

	// Held again: a new chain.
	again := Hold(16 << 20)
	waitGOGC(t, 400)
	again()
}

func TestHoldLeavesAnOperatorsGOGC(t *testing.T) {
	t.Setenv("GOGC", "200")
	defer debug.SetGCPercent(debug.SetGCPercent(200))
	release := Hold(16 << 20)
	defer release()
	for range 3 {
		runtime.GC()
	}
	time.Sleep(10 * time.Millisecond)
	if g := gogc(); g != 200 {
		t.Fatalf("GOGC %d with GOGC=200 in the environment, want 200", g)
	}
	if n := Hold(RuntimeMinimum); n == nil {
		t.Fatal("Hold returned no release")
	}
}
