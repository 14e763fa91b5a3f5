package shadow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gatedOpener opens an in-memory store once open is closed, failing (as an unreachable
// database does) until then; it counts its calls.
type gatedOpener struct {
	open  chan struct{}
	calls atomic.Int64
	once  sync.Once
	st    *Store
	err   error
}

func newGatedOpener() *gatedOpener { return &gatedOpener{open: make(chan struct{})} }

func (g *gatedOpener) fn(ctx context.Context) (*Store, error) {
	g.calls.Add(1)
	select {
	case <-g.open:
	default:
		return nil, errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	}
	g.once.Do(func() { g.st, g.err = OpenStore(ctx, "") })
	return g.st, g.err
}

func (g *gatedOpener) release() { close(g.open) }

// fastRetries keeps a test's back-off short (the count of tries is asserted, not their time).
var fastRetries = WriterConfig{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}

// waitFor polls cond every 5 ms for at most 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 6000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("gave up waiting for %s", what)
}

func closeWriter(t *testing.T, w *Writer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
}

// TestWriterHoldsUntilTheStoreOpens: records given before the store can be opened wait,
// in order, and are written once it opens; the tries are counted.
func TestWriterHoldsUntilTheStoreOpens(t *testing.T) {
	g := newGatedOpener()
	var opened atomic.Pointer[Store]
	cfg := fastRetries
	cfg.OnOpen = func(st *Store) { opened.Store(st) }
	w := StartWriter(g.fn, cfg)
	defer closeWriter(t, w)
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for i := range 10 {
		p := testPair("chat", i, t0.Add(time.Duration(i)*time.Second), false)
		p.Session = ""
		if !w.AddPairSession(p, fmt.Sprintf("session-%d", i)) {
			t.Fatalf("pair %d refused with room left", i)
		}
	}
	if !w.AddVerdict(VerdictRecord{Route: "chat", Time: t0, Verdict: Verdict{Decision: Hold, Reason: "x"}}) {
		t.Fatal("verdict refused")
	}
	waitFor(t, "tries to open", func() bool { return g.calls.Load() >= 3 })
	if s := w.Stats(); s.Opened || s.Connected || s.Buffered != 11 || s.Written != 0 || s.Retries < 2 || s.LastError == "" || s.DownSince.IsZero() {
		t.Fatalf("before the store opens: %+v", s)
	}
	if w.Store() != nil {
		t.Fatal("a store before it opened")
	}
	g.release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	s := w.Stats()
	if !s.Opened || !s.Connected || s.Buffered != 0 || s.BufferedBytes != 0 || s.Written != 11 || s.Failed != 0 || !s.DownSince.IsZero() {
		t.Fatalf("after: %+v", s)
	}
	if opened.Load() == nil || opened.Load() != w.Store() {
		t.Fatal("OnOpen was not given the store")
	}
	ps, err := w.Store().Pairs(ctx, "chat", 100)
	if err != nil || len(ps) != 10 {
		t.Fatalf("%d pairs stored, %v", len(ps), err)
	}
	for i, p := range ps {
		if want := t0.Add(time.Duration(9-i) * time.Second); !p.Time.Equal(want) {
			t.Fatalf("pair %d at %v, want %v", i, p.Time, want)
		}
		if want := w.Store().SessionHash(fmt.Sprintf("session-%d", 9-i)); p.Session != want {
			t.Fatalf("pair %d: session %q, want the store's hash %q", i, p.Session, want)
		}
	}
}

// TestWriterBounds: past MaxBytes records are dropped and counted by kind, never waited
// for; what Close cannot write is counted as dropped; after Close nothing is taken.
func TestWriterBounds(t *testing.T) {
	g := newGatedOpener() // never released: the store stays unreachable
	p := testPair("chat", 1, time.Now(), false)
	size := pairSize(p)
	cfg := fastRetries
	cfg.MaxBytes = 5*size + size/2
	w := StartWriter(g.fn, cfg)
	accepted := 0
	for range 12 {
		if w.AddPair(p) {
			accepted++
		}
	}
	if accepted != 5 {
		t.Fatalf("accepted %d pairs of %d bytes in %d, want 5", accepted, size, cfg.MaxBytes)
	}
	if w.AddVerdict(VerdictRecord{Route: "chat", Verdict: Verdict{Reason: string(make([]byte, size))}}) {
		t.Fatal("a verdict past the bound was taken")
	}
	s := w.Stats()
	if s.Buffered != 5 || s.BufferedBytes != 5*size || s.MaxBytes != cfg.MaxBytes || s.Dropped[KindPair] != 7 || s.Dropped[KindVerdict] != 1 {
		t.Fatalf("stats %+v", s)
	}
	w.SetMaxBytes(6*size + size/2) // a reload: room for one more
	if !w.AddPair(p) || w.AddPair(p) {
		t.Fatal("the new bound is not the one applied")
	}
	if s := w.Stats(); s.Buffered != 6 || s.MaxBytes != 6*size+size/2 || s.Dropped[KindPair] != 8 {
		t.Fatalf("after SetMaxBytes %+v", s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no time to write: the held records are dropped
	if err := w.Close(ctx); err == nil {
		t.Fatal("close with records left reported nothing")
	}
	if w.AddPair(p) || w.AddRate(RateRecord{Route: "chat"}) {
		t.Fatal("a closed writer took a record")
	}
	s = w.Stats()
	if s.Buffered != 0 || s.Dropped[KindPair] != 15 || s.Dropped[KindRate] != 1 || s.Written != 0 {
		t.Fatalf("after close %+v", s)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := w.Flush(context.Background()); err != nil {
		t.Fatalf("flush after close: %v", err)
	}
}

// TestWriterCoalesces: a route's rates and prunes still waiting are replaced by newer ones
// (one each per route), and the newest is what is written.
func TestWriterCoalesces(t *testing.T) {
	g := newGatedOpener()
	w := StartWriter(g.fn, fastRetries)
	defer closeWriter(t, w)
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for i := range 5 {
		w.AddRate(RateRecord{Route: "chat", CandidateID: "cand", Instance: "gw-1", Time: t0.Add(time.Duration(i) * time.Second),
			ReferenceRate: float64(10 + i), CandidateRate: float64(i)})
		w.AddRate(RateRecord{Route: "other", CandidateID: "cand", Instance: "gw-1", Time: t0, ReferenceRate: 1, CandidateRate: 1})
		w.Prune("chat", 100-i)
	}
	if s := w.Stats(); s.Buffered != 3 {
		t.Fatalf("%d held, want 3 (one rate per route, one prune)", s.Buffered)
	}
	g.release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	f, err := w.Store().FleetInput(ctx, "chat", "cand", 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	if f.RateInstances != 1 || f.Input.Load.ReferenceRate != 14 || f.Input.Load.CandidateRate != 4 {
		t.Fatalf("rates %+v from %d instances, want the newest (14, 4)", f.Input.Load, f.RateInstances)
	}
	if s := w.Stats(); s.Written != 3 {
		t.Fatalf("%d written, want 3", s.Written)
	}
}

// TestWriterRefusedRecord: a record the store refuses for good is counted as failed and
// not tried again; the records after it are written.
func TestWriterRefusedRecord(t *testing.T) {
	g := newGatedOpener()
	g.release()
	w := StartWriter(g.fn, fastRetries)
	defer closeWriter(t, w)
	w.AddPair(PairRecord{}) // no route
	w.AddRate(RateRecord{Route: "chat", ReferenceRate: -1})
	w.AddPair(testPair("chat", 1, time.Now(), false))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	s := w.Stats()
	if s.Failed != 2 || s.Written != 1 || s.Retries != 0 || !s.Connected || s.LastError == "" {
		t.Fatalf("stats %+v", s)
	}
}

// TestWriterConcurrent: records added from many goroutines while the writer writes are
// each written or dropped, none lost or written twice.
func TestWriterConcurrent(t *testing.T) {
	g := newGatedOpener()
	g.release()
	p := testPair("chat", 1, time.Now(), false)
	cfg := fastRetries
	cfg.MaxBytes = 20 * pairSize(p)
	w := StartWriter(g.fn, cfg)
	defer closeWriter(t, w)
	const writers, each = 8, 40
	var taken atomic.Int64
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				if w.AddPair(p) {
					taken.Add(1)
				}
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	s := w.Stats()
	n, _, err := w.Store().Count(ctx, "chat")
	if err != nil || s.Written != taken.Load() || n != taken.Load() || s.Written+s.Dropped[KindPair] != writers*each {
		t.Fatalf("taken %d, written %d, stored %d, dropped %d (%v)", taken.Load(), s.Written, n, s.Dropped[KindPair], err)
	}
}
