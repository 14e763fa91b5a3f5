package shadow

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// fakeSender answers every copy with the text of its side, after gate (when set) is closed.
type fakeSender struct {
	gate  chan struct{}
	mu    sync.Mutex
	calls []string // role/cluster/model of each copy
}

func (f *fakeSender) SendCopy(ctx context.Context, j *Job, cluster, model, role string) (Answer, float64) {
	f.mu.Lock()
	f.calls = append(f.calls, role+"/"+cluster+"/"+model)
	f.mu.Unlock()
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return Answer{Status: 504, ErrorClass: string(policy.ClassTimeout)}, 0
		}
	}
	return Answer{Status: 200, Text: "the answer is forty two", FinishReason: "stop", OutputTokens: 5}, 1
}

const primaryBody = `{"choices":[{"index":0,"message":{"role":"assistant","content":"the answer is forty two"},"finish_reason":"stop"}],"usage":{"completion_tokens":5}}`

func testRequest(t *testing.T, session string) *policy.Request {
	t.Helper()
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"what is the answer?"}]}`)
	or, err := openai.ParseRequest(openai.KindChat, body)
	if err != nil {
		t.Fatal(err)
	}
	return &policy.Request{Request: or, ID: "req-" + session, Route: "chat", Session: session}
}

// startMirror runs a mirror of settings s until the test ends, recording its pairs.
func startMirror(t *testing.T, s Settings, snd Sender) (*Mirror, chan PairRecord) {
	t.Helper()
	recs := make(chan PairRecord, 16)
	m := NewMirror("chat", &s, 100, snd, func(_ context.Context, _ *Job, rec PairRecord) { recs <- rec })
	ctx, cancel := context.WithCancel(context.Background())
	m.Configure(ctx, &s)()
	t.Cleanup(func() {
		cancel()
		m.Halter()()
	})
	return m, recs
}

func baseSettings() Settings {
	return Settings{Cluster: "cand", Fraction: 1, MaxQueue: 4, MaxConcurrency: 2, Timeout: 2 * time.Second,
		CaptureBytes: 1 << 16, CaptureTotal: 1 << 20, MaxEventBytes: 1 << 16}
}

func offer(t *testing.T, m *Mirror, session string) *Job {
	t.Helper()
	preq := testRequest(t, session)
	if !m.Samples(preq, "main") {
		t.Fatalf("session %q not sampled at fraction 1", session)
	}
	return m.Offer(Offer{Request: preq, ID: preq.ID, Path: "/v1/chat/completions", Endpoint: "/v1/chat/completions",
		Header: http.Header{}, PrimaryCluster: "main", PrimaryLoad: 1})
}

func waitRecord(t *testing.T, recs chan PairRecord) PairRecord {
	t.Helper()
	select {
	case r := <-recs:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no pair recorded within 5s")
		return PairRecord{}
	}
}

// TestMirrorComparesWhoeverFinishesLast: a triple is compared once both sides are in, on the
// worker when the primary finished first and on a comparer when the sandbox did; the record
// carries the request's id and path, and every captured byte goes back to the budget.
func TestMirrorComparesWhoeverFinishesLast(t *testing.T) {
	for _, primaryFirst := range []bool{true, false} {
		snd := &fakeSender{gate: make(chan struct{})}
		m, recs := startMirror(t, baseSettings(), snd)
		j := offer(t, m, "s1")
		if j == nil {
			t.Fatal("offer dropped")
		}
		j.Capture([]byte(primaryBody), false)
		if primaryFirst {
			j.PrimaryDone(policy.Outcome{Status: 200}, &openai.Tap{}, false)
			close(snd.gate)
		} else {
			close(snd.gate)
			// The worker is done first: the handler must hand the triple to a comparer.
			deadline := time.Now().Add(5 * time.Second)
			for !j.sandboxDoneForTest() {
				if time.Now().After(deadline) {
					t.Fatal("the sandbox side did not finish")
				}
				time.Sleep(time.Millisecond)
			}
			j.PrimaryDone(policy.Outcome{Status: 200}, &openai.Tap{}, false)
		}
		rec := waitRecord(t, recs)
		if rec.RequestID != "req-s1" || rec.Endpoint != "/v1/chat/completions" || rec.Route != "chat" || rec.CandidateID != "cand" {
			t.Errorf("primary first %v: record %+v", primaryFirst, rec)
		}
		if !rec.Result.Primary.OK || !rec.Result.Candidate.OK || rec.Primary.Text != "the answer is forty two" {
			t.Errorf("primary first %v: result %+v, primary %+v", primaryFirst, rec.Result, rec.Primary)
		}
		c := m.Counters()
		if c.Offered != 1 || c.Pairs != 1 || c.Incomplete != 0 || c.Dropped != 0 {
			t.Errorf("primary first %v: counters %+v", primaryFirst, c)
		}
		if c.Captured != 0 {
			t.Errorf("primary first %v: %d captured bytes not released", primaryFirst, c.Captured)
		}
	}
}

// TestMirrorBaselineAndReplica: with a baseline the copy goes to the candidate and to the
// baseline (with the primary's model); without one, a sampled replica goes to the primary's
// cluster; a request the candidate serves itself is not mirrored.
func TestMirrorBaselineAndReplica(t *testing.T) {
	s := baseSettings()
	s.Baseline, s.Model = "base", "cand-model"
	snd := &fakeSender{}
	m, recs := startMirror(t, s, snd)
	preq := testRequest(t, "s2")
	j := m.Offer(Offer{Request: preq, ID: "r", Header: http.Header{}, PrimaryCluster: "main", PrimaryModel: "prim-model", PrimaryLoad: 1})
	j.Capture([]byte(primaryBody), false)
	j.PrimaryDone(policy.Outcome{Status: 200}, nil, false)
	rec := waitRecord(t, recs)
	if rec.Baseline == nil || rec.CandidateID != "cand/cand-model vs base" {
		t.Errorf("no baseline in %+v", rec)
	}
	snd.mu.Lock()
	calls := append([]string(nil), snd.calls...)
	snd.mu.Unlock()
	want := map[string]bool{"candidate/cand/cand-model": true, "baseline/base/prim-model": true}
	if len(calls) != 2 || !want[calls[0]] || !want[calls[1]] {
		t.Errorf("copies %v, want the candidate's and the baseline's", calls)
	}
	if m.Samples(preq, "cand") {
		t.Error("a request the candidate's split serves was mirrored")
	}
}

// TestMirrorIncompleteAndDropped: a primary that does not finish within the time-out after
// its sandbox is not compared (counted incomplete, its capture released when it ends); a
// faulted primary is not compared; a full queue drops the copy (counted).
func TestMirrorIncompleteAndDropped(t *testing.T) {
	s := baseSettings()
	s.Timeout = 50 * time.Millisecond
	m, recs := startMirror(t, s, &fakeSender{})
	j := offer(t, m, "s3")
	j.Capture([]byte(primaryBody), false)
	deadline := time.Now().Add(5 * time.Second)
	for m.Counters().Incomplete == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lone sandbox answer did not expire")
		}
		time.Sleep(5 * time.Millisecond)
	}
	j.PrimaryDone(policy.Outcome{Status: 200}, nil, false)
	if c := m.Counters(); c.Captured != 0 || c.Pairs != 0 {
		t.Errorf("after expiry: %+v", c)
	}

	j = offer(t, m, "s4")
	j.Capture([]byte(primaryBody), false)
	j.PrimaryDone(policy.Outcome{Status: 200}, nil, true) // chaos acted on it
	for m.Counters().Incomplete < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the faulted primary was not counted incomplete")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case r := <-recs:
		t.Errorf("recorded %+v", r)
	default:
	}

	// A full queue: one worker held, no room to wait.
	s = baseSettings()
	s.MaxQueue, s.MaxConcurrency = 0, 1
	snd := &fakeSender{gate: make(chan struct{})}
	m, _ = startMirror(t, s, snd)
	deadline = time.Now().Add(5 * time.Second)
	var first *Job
	for first == nil { // max_queue 0: taken only once the worker waits for a copy
		if first = offer(t, m, "s5"); first == nil {
			time.Sleep(time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatal("the first copy was never taken")
		}
	}
	dropped := m.Counters().Dropped
	for m.Counters().Started == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first copy was not started")
		}
		time.Sleep(time.Millisecond)
	}
	if j := offer(t, m, "s6"); j != nil {
		t.Error("a copy was queued past max_queue 0 with the worker busy")
	}
	if c := m.Counters(); c.Dropped != dropped+1 {
		t.Errorf("dropped %d, want %d", c.Dropped, dropped+1)
	}
	close(snd.gate)
	first.PrimaryDone(policy.Outcome{Status: 499, ErrorClass: policy.ClassClientCancel}, nil, false)
}

// sandboxDoneForTest reports whether the worker is done with the job.
func (j *Job) sandboxDoneForTest() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.sandboxIn
}
