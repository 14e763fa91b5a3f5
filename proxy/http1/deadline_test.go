package http1

import (
	"sync"
	"testing"
	"time"
)

// setter records what a deadline put on the connection.
type setter struct {
	mu    sync.Mutex
	calls []time.Time
}

func (s *setter) set(t time.Time) error {
	s.mu.Lock()
	s.calls = append(s.calls, t)
	s.mu.Unlock()
	return nil
}

func (s *setter) got() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.calls...)
}

func TestDeadline(t *testing.T) {
	const soon = 30 * time.Millisecond
	past := time.Unix(5, 0)
	// settle is long enough for an alarm due soon to have fired.
	settle := func() { time.Sleep(soon + 150*time.Millisecond) }
	for _, tc := range []struct {
		name string
		run  func(d *deadline)
		want []time.Time // what reached the connection, in order
	}{
		{"due: a past deadline goes on", func(d *deadline) {
			_ = d.Set(time.Now().Add(soon))
			settle()
		}, []time.Time{longAgo}},
		{"lifted before it is due: nothing", func(d *deadline) {
			_ = d.Set(time.Now().Add(soon))
			_ = d.Set(time.Time{})
			settle()
		}, nil},
		{"moved later: not at the first time", func(d *deadline) {
			_ = d.Set(time.Now().Add(soon))
			_ = d.Set(time.Now().Add(time.Hour))
			settle()
		}, nil},
		{"already past: at once", func(d *deadline) {
			_ = d.Set(past)
		}, []time.Time{past}},
		{"lifted after it fired: cleared", func(d *deadline) {
			_ = d.Set(time.Now().Add(soon))
			settle()
			_ = d.Set(time.Time{})
		}, []time.Time{longAgo, {}}},
		{"moved after it fired: cleared, then due again", func(d *deadline) {
			_ = d.Set(time.Now().Add(soon))
			settle()
			_ = d.Set(time.Now().Add(soon))
			settle()
		}, []time.Time{longAgo, {}, longAgo}},
		{"lifted without one: nothing", func(d *deadline) {
			_ = d.Set(time.Time{})
			d.after(0)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &setter{}
			d := &deadline{set: s.set}
			tc.run(d)
			got := s.got()
			if len(got) != len(tc.want) {
				t.Fatalf("set %v, want %v", got, tc.want)
			}
			for i := range got {
				if !got[i].Equal(tc.want[i]) {
					t.Fatalf("set %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// Stopped (the connection closes or goes to net/http's server): nothing more reaches the
// connection, not even the pending deadline; later deadlines are the connection's own.
func TestDeadlineStop(t *testing.T) {
	s := &setter{}
	d := &deadline{set: s.set}
	_ = d.Set(time.Now().Add(30 * time.Millisecond))
	d.stop()
	time.Sleep(200 * time.Millisecond)
	if got := s.got(); len(got) != 0 {
		t.Fatalf("set %v after stop, want nothing", got)
	}
	later := time.Now().Add(time.Hour)
	_ = d.Set(later)
	if got := s.got(); len(got) != 1 || !got[0].Equal(later) {
		t.Fatalf("set %v, want [%v]: the connection's own deadline", got, later)
	}
}
