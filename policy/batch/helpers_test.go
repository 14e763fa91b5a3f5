package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/test/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// upstream is a simulator called in process, recording every body it is sent.
type upstream struct {
	srv    *sim.Server
	mu     sync.Mutex
	bodies [][]byte
}

func newUpstream(t testing.TB, cfg sim.Config) *upstream {
	u := &upstream{srv: sim.New(cfg)}
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) send(path string) Send {
	return func(ctx context.Context, body []byte) (int, http.Header, []byte, error) {
		u.mu.Lock()
		u.bodies = append(u.bodies, bytes.Clone(body))
		u.mu.Unlock()
		return u.direct(ctx, path, body)
	}
}

// direct asks the simulator without recording.
func (u *upstream) direct(ctx context.Context, path string, body []byte) (int, http.Header, []byte, error) {
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body))
	rec := httptest.NewRecorder()
	u.srv.ServeHTTP(rec, req)
	return rec.Code, rec.Header(), rec.Body.Bytes(), ctx.Err()
}

func (u *upstream) requests() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([][]byte(nil), u.bodies...)
}

// inputsOf returns the number of inputs of each recorded body.
func (u *upstream) inputsOf(t testing.TB, field string) []int {
	var out []int
	for _, b := range u.requests() {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		var list []json.RawMessage
		if json.Unmarshal(m[field], &list) != nil || (len(list) > 0 && list[0][0] != '"' && list[0][0] != '[') {
			out = append(out, 1)
			continue
		}
		out = append(out, len(list))
	}
	return out
}

func mustParse(t testing.TB, kind openai.Kind, body string) *openai.Request {
	t.Helper()
	r, err := openai.ParseRequest(kind, []byte(body))
	if err != nil {
		t.Fatalf("parse %s: %v", body, err)
	}
	return r
}

func newBatcher(t testing.TB, p Params, clock interface{ Now() time.Time }) *Batcher {
	t.Helper()
	b, err := New(p, clock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// doAsync starts Do and returns where its answer will arrive.
func doAsync(ctx context.Context, b *Batcher, r *openai.Request, tenant string, send Send) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		st, h, body, err := b.Do(ctx, r, tenant, send)
		ch <- answer{st, h, body, err}
	}()
	return ch
}

// waitWaiting waits until n callers wait in open batches (test-side polling only).
func waitWaiting(t testing.TB, b *Batcher, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for b.Snapshot().Waiting != n {
		if time.Now().After(deadline) {
			t.Fatalf("waiting = %d, want %d", b.Snapshot().Waiting, n)
		}
		time.Sleep(time.Millisecond)
	}
}

type embeddingsAnswer struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float64 `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

// fakeClock is a policy.Clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestRegistered: the batcher is built through the policy registry like every policy, named
// by its spec, and offers what the send step and a reload look for.
func TestRegistered(t *testing.T) {
	p, err := policy.Build(policy.Spec{Type: Type, Name: "emb", Params: map[string]any{"max_items": 8}}, policy.Env{Route: "r"})
	if err != nil {
		t.Fatal(err)
	}
	b, ok := p.(*Batcher)
	if !ok {
		t.Fatalf("built a %T", p)
	}
	t.Cleanup(func() { _ = b.Close() })
	if got := p.TypedName(); got != (policy.TypedName{Type: "batch", Name: "emb"}) {
		t.Errorf("TypedName = %+v", got)
	}
	if _, ok := p.(io.Closer); !ok {
		t.Error("a batcher is not an io.Closer: a reload would leave its flushers running")
	}
	q, err := policy.Build(policy.Spec{Type: Type}, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.(*Batcher).Close() })
	if got := q.TypedName().Name; got != "batch" {
		t.Errorf("unnamed batcher's name %q, want its type", got)
	}
	if _, err := policy.Build(policy.Spec{Type: Type, Params: map[string]any{"max_itemz": 1}}, policy.Env{}); err == nil {
		t.Error("unknown param accepted")
	}
}
