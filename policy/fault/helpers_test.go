package fault

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/policy/clocktest"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeClock = clocktest.Clock

func newClock() *fakeClock { return clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) }

// sleeps records the waits the engine asked for instead of sleeping.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// newEngine returns an enabled engine with the given faults, a fake clock and recorded
// sleeps.
func newEngine(t testing.TB, faults ...Spec) (*Engine, *fakeClock, *sleeps) {
	t.Helper()
	clk := newClock()
	e, err := New(Config{Enabled: true, Faults: faults}, clk, 1)
	if err != nil {
		t.Fatal(err)
	}
	s := &sleeps{}
	e.sleep = s.sleep
	return e, clk, s
}

// specs parses header syntax into specs (a short way to write faults in tests).
func specs(t testing.TB, h string) []Spec {
	t.Helper()
	s, err := ParseHeader(h)
	if err != nil {
		t.Fatalf("ParseHeader(%q): %v", h, err)
	}
	return s
}

func request(id, model string) *policy.Request {
	return &policy.Request{Request: &openai.Request{Model: model, Stream: true}, ID: id}
}

func readFile(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// events splits a stream into its events' raw bytes.
func events(t testing.TB, s string) []string {
	t.Helper()
	rd := openai.NewReader(strings.NewReader(s), 0)
	var out []string
	for {
		ev, err := rd.Next()
		if len(ev.Raw) > 0 {
			out = append(out, string(ev.Raw))
		}
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("events: %v", err)
		}
	}
}

// dataEvents returns the data payloads of a stream's events with data.
func dataEvents(t testing.TB, s string) []string {
	t.Helper()
	rd := openai.NewReader(strings.NewReader(s), 0)
	var out []string
	for {
		ev, err := rd.Next()
		if err != nil {
			return out
		}
		if ev.Data != nil {
			out = append(out, string(ev.Data))
		}
	}
}

// upstream reads the stream through the upstream faults of a first attempt.
func upstream(t testing.TB, e *Engine, in string, streaming bool) (string, error) {
	t.Helper()
	inj := e.Plan(request("r1", "llama"), "chat", nil)
	defer inj.Done(Outcome{Status: 200})
	rc := inj.Attempt("primary").WrapUpstream(context.Background(), io.NopCloser(strings.NewReader(in)), streaming)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

// downstream writes the stream through the downstream faults as the gateway does (headers,
// then one Write and one Flush per event) and returns what the client got, and the value
// of a panic.
func downstream(t testing.TB, e *Engine, in string, contentType string) (out string, panicked any) {
	t.Helper()
	inj := e.Plan(request("r1", "llama"), "chat", nil)
	defer inj.Done(Outcome{Status: 200})
	rec := httptest.NewRecorder()
	w := inj.WrapDownstream(context.Background(), rec)
	func() {
		defer func() { panicked = recover() }()
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("Content-Length", "1234")
		w.WriteHeader(http.StatusOK)
		if !strings.HasPrefix(contentType, "text/event-stream") {
			_, _ = w.Write([]byte(in))
			return
		}
		for _, ev := range events(t, in) {
			if _, err := w.Write([]byte(ev)); err != nil {
				t.Errorf("write: %v", err)
				return
			}
			w.(http.Flusher).Flush()
		}
	}()
	return rec.Body.String(), panicked
}
