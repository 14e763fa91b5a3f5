package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/test/sim"
)

const second = policy.Duration(time.Second)

// slow: a window long enough that only a cap (or Close) sends a batch.
func slow(p Params) Params {
	p.MinWindow, p.InitialWindow, p.MaxWindow = second, second, second
	return p
}

func TestAIMD(t *testing.T) {
	p := Params{MinWindow: policy.Duration(time.Millisecond), MaxWindow: policy.Duration(10 * time.Millisecond),
		TargetLatency: policy.Duration(50 * time.Millisecond), Increase: policy.Duration(2 * time.Millisecond), Decrease: 0.5}.WithDefaults()
	ms := time.Millisecond
	cases := []struct {
		name string
		w    time.Duration
		lats []time.Duration
		want time.Duration
	}{
		{"grows additively under target", 2 * ms, []time.Duration{10 * ms, 20 * ms}, 6 * ms},
		{"at target still grows", 2 * ms, []time.Duration{50 * ms}, 4 * ms},
		{"bounded by max_window", 8 * ms, []time.Duration{ms, ms, ms}, 10 * ms},
		{"shrinks multiplicatively over target", 8 * ms, []time.Duration{60 * ms}, 4 * ms},
		{"twice", 8 * ms, []time.Duration{60 * ms, 60 * ms}, 2 * ms},
		{"bounded by min_window", 2 * ms, []time.Duration{time.Second, time.Second}, ms},
		{"grows again after shrinking", 8 * ms, []time.Duration{60 * ms, ms}, 6 * ms},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.w
			for _, l := range tc.lats {
				w, _ = aimd(w, l, p)
			}
			if w != tc.want {
				t.Fatalf("window %v, want %v", w, tc.want)
			}
		})
	}
}

// The batcher feeds each batch's latency, measured with its clock, to AIMD.
func TestWindowAdaptsToBatchLatency(t *testing.T) {
	clk := &fakeClock{now: time.Unix(0, 0)}
	ms := policy.Duration(time.Millisecond)
	b := newBatcher(t, Params{MinWindow: ms, InitialWindow: 2 * ms, MaxWindow: 5 * ms, TargetLatency: 50 * ms,
		Increase: ms, Decrease: 0.5, MaxItems: 1}, clk)
	lat := 10 * time.Millisecond
	send := func(ctx context.Context, body []byte) (int, http.Header, []byte, error) {
		clk.Advance(lat)
		return 200, nil, []byte(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1]}]}`), nil
	}
	r := mustParse(t, openai.KindEmbedding, `{"model":"m","input":"x"}`)
	step := func(l time.Duration, want time.Duration) {
		t.Helper()
		lat = l
		if st, _, _, err := b.Do(context.Background(), r, "", send); st != 200 || err != nil {
			t.Fatalf("Do: %d %v", st, err)
		}
		if got := b.Window(); got != want {
			t.Fatalf("after a %v batch: window %v, want %v", l, got, want)
		}
	}
	step(10*time.Millisecond, 3*time.Millisecond)
	step(10*time.Millisecond, 4*time.Millisecond)
	step(10*time.Millisecond, 5*time.Millisecond)
	step(10*time.Millisecond, 5*time.Millisecond) // max
	step(80*time.Millisecond, 2500*time.Microsecond)
	step(80*time.Millisecond, 1250*time.Microsecond)
	step(80*time.Millisecond, time.Millisecond) // min
	if s := b.Stats(); s.WindowGrows != 4 || s.WindowShrinks != 3 || s.Batches != 7 || s.EarlyFlushes != 7 {
		t.Fatalf("stats %+v", s)
	}
}

func TestSplitBackMixedInputs(t *testing.T) {
	up := newUpstream(t, sim.Config{})
	bodies := []string{
		`{"model":"sim-llama","input":"alpha beta"}`,
		`{"model":"sim-llama","input":["gamma","delta delta delta","epsilon"]}`,
		`{"model":"sim-llama","input":["zeta zeta zeta zeta zeta zeta zeta zeta"]}`,
		`{"model":"sim-llama","input":"eta"}`,
		`{"input":["theta","iota"],"model":"sim-llama"}`, // same fields, other order: same key
	}
	b := newBatcher(t, slow(Params{MaxItems: 8}), nil)
	var chans []<-chan answer
	for i, body := range bodies {
		chans = append(chans, doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, body), "team-a", up.send("/v1/embeddings")))
		if i < len(bodies)-1 {
			waitWaiting(t, b, i+1) // keep the arrival order
		}
	}
	sum := 0
	for i, ch := range chans {
		a := <-ch
		if a.err != nil || a.status != 200 {
			t.Fatalf("caller %d: %d %v %s", i, a.status, a.err, a.body)
		}
		if a.header.Get("Content-Length") != "" {
			t.Fatalf("caller %d: Content-Length kept", i)
		}
		got := decode[embeddingsAnswer](t, a.body)
		_, _, alone, _ := up.direct(context.Background(), "/v1/embeddings", []byte(bodies[i]))
		want := decode[embeddingsAnswer](t, alone)
		if got.Object != "list" || got.Model != want.Model || len(got.Data) != len(want.Data) {
			t.Fatalf("caller %d: got %+v, want %+v", i, got, want)
		}
		for j := range got.Data {
			if got.Data[j].Index != j || !reflect.DeepEqual(got.Data[j].Embedding, want.Data[j].Embedding) || got.Data[j].Object != "embedding" {
				t.Fatalf("caller %d item %d: index %d or embedding differs from the answer alone", i, j, got.Data[j].Index)
			}
		}
		if got.Usage.TotalTokens != got.Usage.PromptTokens || got.Usage.PromptTokens < 1 {
			t.Fatalf("caller %d: usage %+v", i, got.Usage)
		}
		sum += got.Usage.PromptTokens
	}
	reqs := up.requests()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests, want 1 batch", len(reqs))
	}
	var in struct {
		Input []string `json:"input"`
	}
	if err := json.Unmarshal(reqs[0], &in); err != nil {
		t.Fatal(err)
	}
	wantIn := []string{"alpha beta", "gamma", "delta delta delta", "epsilon", "zeta zeta zeta zeta zeta zeta zeta zeta", "eta", "theta", "iota"}
	if !reflect.DeepEqual(in.Input, wantIn) {
		t.Fatalf("upstream inputs %q, want %q", in.Input, wantIn)
	}
	_, _, whole, _ := up.direct(context.Background(), "/v1/embeddings", reqs[0])
	if total := decode[embeddingsAnswer](t, whole).Usage.PromptTokens; sum != total {
		t.Fatalf("usage shares sum to %d, batch used %d", sum, total)
	}
}

func TestTokenIDInputs(t *testing.T) {
	up := newUpstream(t, sim.Config{})
	b := newBatcher(t, slow(Params{MaxItems: 3}), nil)
	send := up.send("/v1/embeddings")
	a1 := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":[1,2,3]}`), "", send)
	waitWaiting(t, b, 1)
	a2 := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":[[4,5],[6]]}`), "", send)
	for i, ch := range []<-chan answer{a1, a2} {
		a := <-ch
		got := decode[embeddingsAnswer](t, a.body)
		if a.status != 200 || len(got.Data) != i+1 {
			t.Fatalf("caller %d: %d %s", i, a.status, a.body)
		}
	}
	reqs := up.requests()
	if len(reqs) != 1 || !strings.Contains(string(reqs[0]), `"input":[[1,2,3],[4,5],[6]]`) {
		t.Fatalf("upstream saw %q", reqs)
	}
}

func TestKeys(t *testing.T) {
	cases := []struct {
		name   string
		a, b   string
		ta, tb string
		merged bool
	}{
		{"same", `{"model":"sim-llama","input":"x","dimensions":8}`, `{"model":"sim-llama","input":["y"],"dimensions":8}`, "t", "t", true},
		{"tenant", `{"model":"sim-llama","input":"x"}`, `{"model":"sim-llama","input":"y"}`, "t1", "t2", false},
		{"dimensions", `{"model":"sim-llama","input":"x","dimensions":8}`, `{"model":"sim-llama","input":"y","dimensions":16}`, "", "", false},
		{"encoding_format", `{"model":"sim-llama","input":"x","encoding_format":"float"}`, `{"model":"sim-llama","input":"y","encoding_format":"base64"}`, "", "", false},
		{"user", `{"model":"sim-llama","input":"x","user":"u1"}`, `{"model":"sim-llama","input":"y"}`, "", "", false},
		{"text and token IDs", `{"model":"sim-llama","input":"x"}`, `{"model":"sim-llama","input":[1,2]}`, "", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, sim.Config{})
			ms := policy.Duration(30 * time.Millisecond)
			b := newBatcher(t, Params{MinWindow: ms, InitialWindow: ms, MaxWindow: ms, MaxItems: 2}, nil)
			send := up.send("/v1/embeddings")
			a1 := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, tc.a), tc.ta, send)
			waitWaiting(t, b, 1)
			a2 := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, tc.b), tc.tb, send)
			for _, ch := range []<-chan answer{a1, a2} {
				if a := <-ch; a.status != 200 || len(decode[struct{ Data []json.RawMessage }](t, a.body).Data) != 1 {
					t.Fatalf("%d %s", a.status, a.body)
				}
			}
			want := 2
			if tc.merged {
				want = 1
			}
			if n := len(up.requests()); n != want {
				t.Fatalf("upstream saw %d requests, want %d", n, want)
			}
		})
	}
}

func TestCaps(t *testing.T) {
	in := func(n int, word string) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprintf("%q", word)
		}
		return `{"model":"sim-llama","input":[` + strings.Join(s, ",") + `]}`
	}
	long := strings.Repeat("word ", 40) // about 50 tokens
	cases := []struct {
		name   string
		p      Params
		bodies []string
		want   []int // inputs per upstream request, in order
		alone  int64
	}{
		{"max_items: the overflowing caller starts the next batch", Params{MaxItems: 4}, []string{in(3, "a"), in(2, "b"), in(2, "c")}, []int{3, 4}, 0},
		{"max_items: a full batch is sent at once", Params{MaxItems: 4}, []string{in(1, "a"), in(3, "b"), in(4, "c")}, []int{4, 4}, 0},
		{"backend_max_inputs is a cap too", Params{MaxItems: 100, BackendMaxInputs: 2}, []string{in(1, "a"), in(1, "b"), in(2, "c")}, []int{2, 2}, 0},
		{"an oversized caller goes alone", Params{MaxItems: 4}, []string{in(5, "a"), in(4, "b")}, []int{5, 4}, 1},
		{"max_tokens", Params{MaxTokens: 120}, []string{in(1, long), in(1, long), in(1, long)}, []int{2, 1}, 0},
		{"max_tokens: oversized alone", Params{MaxTokens: 40}, []string{in(1, long), in(1, "x")}, []int{1, 1}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, sim.Config{})
			b, err := New(slow(tc.p), nil)
			if err != nil {
				t.Fatal(err)
			}
			send := up.send("/v1/embeddings")
			var chans []<-chan answer
			for _, body := range tc.bodies {
				before := len(up.requests())
				r := mustParse(t, openai.KindEmbedding, body)
				chans = append(chans, doAsync(context.Background(), b, r, "", send))
				// Wait until the caller is queued or sent.
				deadline := time.Now().Add(5 * time.Second)
				for b.Stats().Requests < int64(len(chans)) || (b.Snapshot().Waiting == 0 && len(up.requests()) == before && b.Stats().Alone == 0) {
					if time.Now().After(deadline) {
						t.Fatal("caller not queued")
					}
					time.Sleep(time.Millisecond)
				}
				time.Sleep(5 * time.Millisecond)
			}
			b.Close() // sends what is still open
			for _, ch := range chans {
				if a := <-ch; a.status != 200 {
					t.Fatalf("%d %s", a.status, a.body)
				}
			}
			if got := up.inputsOf(t, "input"); !reflect.DeepEqual(got, tc.want) && !(tc.alone > 0 && sameMultiset(got, tc.want)) {
				t.Fatalf("upstream inputs per request %v, want %v", got, tc.want)
			}
			if s := b.Stats(); s.Alone != tc.alone {
				t.Fatalf("alone %d, want %d", s.Alone, tc.alone)
			}
		})
	}
}

func sameMultiset(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[int]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		m[x]--
	}
	for _, v := range m {
		if v != 0 {
			return false
		}
	}
	return true
}

func TestCancelBeforeSend(t *testing.T) {
	up := newUpstream(t, sim.Config{})
	b := newBatcher(t, slow(Params{MaxItems: 3}), nil)
	send := up.send("/v1/embeddings")
	a := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"a"}`), "", send)
	waitWaiting(t, b, 1)
	ctx, cancel := context.WithCancel(context.Background())
	gone := doAsync(ctx, b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"gone"}`), "", send)
	waitWaiting(t, b, 2)
	cancel()
	if g := <-gone; !errors.Is(g.err, context.Canceled) {
		t.Fatalf("cancelled caller got %v", g.err)
	}
	waitWaiting(t, b, 1)
	c := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":["c1","c2"]}`), "", send)
	for _, ch := range []<-chan answer{a, c} {
		if x := <-ch; x.status != 200 {
			t.Fatalf("%d %s", x.status, x.body)
		}
	}
	reqs := up.requests()
	if len(reqs) != 1 || !strings.Contains(string(reqs[0]), `"input":["a","c1","c2"]`) {
		t.Fatalf("upstream saw %s", reqs)
	}
	if s := b.Stats(); s.CancelledBefore != 1 || s.Batches != 1 || s.Items != 3 {
		t.Fatalf("stats %+v", s)
	}
}

// A lone caller that cancels leaves no batch (and no timer) behind.
func TestCancelOnlyCaller(t *testing.T) {
	b := newBatcher(t, slow(Params{}), nil)
	ctx, cancel := context.WithCancel(context.Background())
	called := false
	ch := doAsync(ctx, b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"a"}`), "", func(context.Context, []byte) (int, http.Header, []byte, error) {
		called = true
		return 200, nil, nil, nil
	})
	waitWaiting(t, b, 1)
	cancel()
	<-ch
	if s := b.Snapshot(); s.Open != 0 || called {
		t.Fatalf("open %d, called %v", s.Open, called)
	}
}

func TestCancelAfterSend(t *testing.T) {
	up := newUpstream(t, sim.Config{})
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	var sendCtx context.Context
	gated := func(ctx context.Context, body []byte) (int, http.Header, []byte, error) {
		sendCtx = ctx
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return 0, nil, nil, ctx.Err()
		}
		return up.send("/v1/embeddings")(ctx, body)
	}
	b := newBatcher(t, slow(Params{MaxItems: 3}), nil)
	a := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"a"}`), "", gated)
	waitWaiting(t, b, 1)
	ctx, cancel := context.WithCancel(context.Background())
	gone := doAsync(ctx, b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":["b","c"]}`), "", gated)
	<-entered // the batch is in flight
	cancel()
	if g := <-gone; !errors.Is(g.err, context.Canceled) || g.status != 0 {
		t.Fatalf("cancelled caller got %d %v", g.status, g.err)
	}
	if sendCtx.Err() != nil {
		t.Fatal("the batch was cancelled while a caller still waits")
	}
	close(release)
	x := <-a
	if x.status != 200 || len(decode[embeddingsAnswer](t, x.body).Data) != 1 {
		t.Fatalf("%d %s", x.status, x.body)
	}
	if n := len(up.requests()); n != 1 {
		t.Fatalf("upstream saw %d requests", n)
	}
	if s := b.Stats(); s.CancelledAfter != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestAllCallersGoneCancelsUpstream(t *testing.T) {
	entered := make(chan struct{}, 1)
	upstreamCancelled := make(chan struct{})
	send := func(ctx context.Context, body []byte) (int, http.Header, []byte, error) {
		entered <- struct{}{}
		<-ctx.Done()
		close(upstreamCancelled)
		return 0, nil, nil, ctx.Err()
	}
	b := newBatcher(t, slow(Params{MaxItems: 2}), nil)
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	a1 := doAsync(ctx1, b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"a"}`), "", send)
	waitWaiting(t, b, 1)
	a2 := doAsync(ctx2, b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"b"}`), "", send)
	<-entered
	cancel1()
	<-a1
	select {
	case <-upstreamCancelled:
		t.Fatal("cancelled with a caller left")
	case <-time.After(10 * time.Millisecond):
	}
	cancel2()
	<-a2
	select {
	case <-upstreamCancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("upstream request not cancelled when every caller had gone")
	}
}

func TestBisectionOn4xx(t *testing.T) {
	// An input over the context window is a 400 for the whole batch.
	up := newUpstream(t, sim.Config{MaxModelLen: 64, MaxTokensDefault: 16})
	const n, bad = 8, 5
	b := newBatcher(t, slow(Params{MaxItems: n}), nil)
	send := up.send("/v1/embeddings")
	var chans []<-chan answer
	for i := range n {
		text := fmt.Sprintf("caller %d", i)
		if i == bad {
			text = strings.Repeat("long ", 100)
		}
		chans = append(chans, doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":["`+text+`"]}`), "", send))
		if i < n-1 {
			waitWaiting(t, b, i+1)
		}
	}
	for i, ch := range chans {
		a := <-ch
		if i == bad {
			if a.status != 400 || !strings.Contains(string(a.body), "context_length_exceeded") {
				t.Fatalf("bad caller: %d %s", a.status, a.body)
			}
			continue
		}
		if a.status != 200 || len(decode[embeddingsAnswer](t, a.body).Data) != 1 {
			for _, r := range up.requests() {
				t.Logf("%.120s", r)
			}
			t.Fatalf("caller %d: %d %.100s", i, a.status, a.body)
		}
	}
	// 8 → 4+4 → 2+2 → 1+1: 7 requests, 3 of them 400.
	if got := len(up.requests()); got != 7 {
		t.Fatalf("upstream saw %d requests, want 7 (1 + 2·log2(8))", got)
	}
	if s := b.Stats(); s.Splits != 3 {
		t.Fatalf("splits %d, want 3", s.Splits)
	}
}

func TestErrorsGoToAll(t *testing.T) {
	cases := []struct {
		name   string
		status int
		err    error
		splits int64
	}{
		{"503", 503, nil, 0},
		{"500", 500, nil, 0},
		{"429 is not bisected", 429, nil, 0},
		{"transport error", 0, errors.New("connection refused"), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			send := func(ctx context.Context, body []byte) (int, http.Header, []byte, error) {
				calls++
				return tc.status, http.Header{"Retry-After": {"1"}}, []byte(`{"error":{"message":"x"}}`), tc.err
			}
			b := newBatcher(t, slow(Params{MaxItems: 3}), nil)
			var chans []<-chan answer
			for i := range 3 {
				chans = append(chans, doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"a"}`), "", send))
				if i < 2 {
					waitWaiting(t, b, i+1)
				}
			}
			for _, ch := range chans {
				a := <-ch
				if a.status != tc.status || !errors.Is(a.err, tc.err) {
					t.Fatalf("got %d %v", a.status, a.err)
				}
				if tc.err == nil && a.header.Get("Retry-After") != "1" {
					t.Fatalf("headers %v", a.header)
				}
			}
			if calls != 1 || b.Stats().Splits != tc.splits {
				t.Fatalf("calls %d, stats %+v", calls, b.Stats())
			}
		})
	}
}

type completionAnswer struct {
	Choices []struct {
		Index int    `json:"index"`
		Text  string `json:"text"`
	} `json:"choices"`
	Usage struct {
		Prompt     int `json:"prompt_tokens"`
		Completion int `json:"completion_tokens"`
		Total      int `json:"total_tokens"`
	} `json:"usage"`
}

func TestCompletionsMerge(t *testing.T) {
	up := newUpstream(t, sim.Config{})
	b := newBatcher(t, slow(Params{MaxItems: 3, MergeCompletions: true}), nil)
	send := up.send("/v1/completions")
	bodies := []string{
		`{"model":"sim-llama","prompt":"Once upon a time","max_tokens":12,"temperature":0}`,
		`{"model":"sim-llama","prompt":["The river","A mountain"],"max_tokens":12,"temperature":0}`,
	}
	var chans []<-chan answer
	for i, body := range bodies {
		chans = append(chans, doAsync(context.Background(), b, mustParse(t, openai.KindCompletion, body), "", send))
		if i == 0 {
			waitWaiting(t, b, 1)
		}
	}
	sumP, sumC := 0, 0
	for i, ch := range chans {
		a := <-ch
		got := decode[completionAnswer](t, a.body)
		_, _, alone, _ := up.direct(context.Background(), "/v1/completions", []byte(bodies[i]))
		want := decode[completionAnswer](t, alone)
		if a.status != 200 || len(got.Choices) != len(want.Choices) {
			t.Fatalf("caller %d: %d %s", i, a.status, a.body)
		}
		for j := range got.Choices {
			if got.Choices[j].Index != j || got.Choices[j].Text != want.Choices[j].Text {
				t.Fatalf("caller %d choice %d: %+v, want %+v", i, j, got.Choices[j], want.Choices[j])
			}
		}
		if got.Usage.Total != got.Usage.Prompt+got.Usage.Completion {
			t.Fatalf("usage %+v", got.Usage)
		}
		sumP += got.Usage.Prompt
		sumC += got.Usage.Completion
	}
	reqs := up.requests()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests", len(reqs))
	}
	_, _, whole, _ := up.direct(context.Background(), "/v1/completions", reqs[0])
	w := decode[completionAnswer](t, whole)
	if sumP != w.Usage.Prompt || sumC != w.Usage.Completion {
		t.Fatalf("usage shares %d/%d, batch %d/%d", sumP, sumC, w.Usage.Prompt, w.Usage.Completion)
	}
}

func TestNotMerged(t *testing.T) {
	cases := []struct {
		name  string
		merge bool
		kind  openai.Kind
		body  string
	}{
		{"completions off by default", false, openai.KindCompletion, `{"model":"sim-llama","prompt":"x"}`},
		{"streamed completions", true, openai.KindCompletion, `{"model":"sim-llama","prompt":"x","stream":true}`},
		{"chat never", true, openai.KindChat, `{"model":"sim-llama","messages":[{"role":"user","content":"x"}]}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBatcher(t, slow(Params{MergeCompletions: tc.merge}), nil)
			r := mustParse(t, tc.kind, tc.body)
			var got []byte
			send := func(ctx context.Context, body []byte) (int, http.Header, []byte, error) {
				got = body
				return 200, nil, []byte("ok"), nil
			}
			if b.Batchable(r) {
				t.Fatal("batchable")
			}
			st, _, body, err := b.Do(context.Background(), r, "", send)
			if st != 200 || string(body) != "ok" || err != nil || string(got) != tc.body {
				t.Fatalf("Do: %d %s %v, upstream got %s", st, body, err, got)
			}
			if s := b.Stats(); s.Alone != 1 || s.Batches != 0 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// A batch of one is sent and answered unchanged (no re-marshalling).
func TestSingleCallerPassThrough(t *testing.T) {
	ms := policy.Duration(time.Millisecond)
	b := newBatcher(t, Params{MinWindow: ms, InitialWindow: ms, MaxWindow: ms}, nil)
	const body = `{"model":"sim-llama","input": ["a"],  "dimensions":8}`
	var got []byte
	send := func(ctx context.Context, in []byte) (int, http.Header, []byte, error) {
		got = in
		return 200, nil, []byte(`{"data": [ ], "x":1}`), nil
	}
	_, _, out, err := b.Do(context.Background(), mustParse(t, openai.KindEmbedding, body), "", send)
	if err != nil || string(got) != body || string(out) != `{"data": [ ], "x":1}` {
		t.Fatalf("sent %s, answered %s, %v", got, out, err)
	}
	if s := b.Stats(); s.Batches != 1 || s.Alone != 0 || s.Sizes[0] != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestBadBatchAnswer(t *testing.T) {
	send := func(ctx context.Context, in []byte) (int, http.Header, []byte, error) {
		return 200, nil, []byte(`{"object":"list","data":[{"index":0}]}`), nil // one item for two
	}
	b := newBatcher(t, slow(Params{MaxItems: 2}), nil)
	a1 := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"a"}`), "", send)
	waitWaiting(t, b, 1)
	a2 := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"b"}`), "", send)
	for _, ch := range []<-chan answer{a1, a2} {
		if a := <-ch; a.status != 502 || !strings.Contains(string(a.body), "batch_split") {
			t.Fatalf("%d %s", a.status, a.body)
		}
	}
}

func TestCloseSendsOpenBatches(t *testing.T) {
	up := newUpstream(t, sim.Config{})
	b, err := New(slow(Params{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	send := up.send("/v1/embeddings")
	a := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"a"}`), "", send)
	waitWaiting(t, b, 1)
	b.Close()
	if x := <-a; x.status != 200 {
		t.Fatalf("%d", x.status)
	}
	st, _, _, err := b.Do(context.Background(), mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"b"}`), "", send)
	if st != 200 || err != nil || b.Stats().Alone != 1 {
		t.Fatalf("after Close: %d %v %+v", st, err, b.Stats())
	}
	b.Close()
}

func TestApportion(t *testing.T) {
	cases := []struct {
		total   int
		weights []int
		want    []int
	}{
		{10, []int{1, 1}, []int{5, 5}},
		{10, []int{1, 1, 1}, []int{4, 3, 3}},
		{7, []int{2, 3, 5}, []int{1, 2, 4}},
		{100, []int{0, 0}, []int{50, 50}},
		{3, []int{0, 5}, []int{0, 3}},
		{0, []int{3, 4}, []int{0, 0}},
		{1, []int{1, 1, 1}, []int{1, 0, 0}},
		{-5, []int{1}, []int{0}},
	}
	for _, tc := range cases {
		got := apportion(tc.total, tc.weights)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("apportion(%d, %v) = %v, want %v", tc.total, tc.weights, got, tc.want)
		}
	}
}

func TestParams(t *testing.T) {
	err := Params{MinWindow: -1, MaxWindow: 2 * second, InitialWindow: -1, TargetLatency: -1, Increase: -1,
		Decrease: 1.5, MaxItems: -1, MaxTokens: -2, BackendMaxInputs: -3}.Validate()
	for _, want := range []string{"min_window", "max_window", "initial_window", "target_latency", "increase", "decrease", "max_items", "max_tokens", "backend_max_inputs"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want %s named", err, want)
		}
	}
	ms := policy.Duration(time.Millisecond)
	if err := (Params{MinWindow: 10 * ms, MaxWindow: 5 * ms}).Validate(); err == nil {
		t.Error("min > max accepted")
	}
	if err := (Params{}).Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	b, err := FromSpec(json.RawMessage(`{"min_window":"1ms","max_window":"10ms","target_latency":0.05,"decrease":0.7,"max_items":64,"merge_completions":true}`), policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p := b.Params()
	if p.MinWindow != ms || p.MaxWindow != 10*ms || p.TargetLatency != 50*ms || p.Decrease != 0.7 || p.MaxItems != 64 || !p.MergeCompletions || p.InitialWindow != ms || b.Window() != time.Millisecond {
		t.Fatalf("params %+v", p)
	}
	if _, err := FromSpec(json.RawMessage(`{"window":"1ms"}`), policy.Env{}); err == nil {
		t.Fatal("unknown field accepted")
	}
	if _, err := FromSpec(json.RawMessage(`{"decrease":2}`), policy.Env{}); err == nil {
		t.Fatal("bad decrease accepted")
	}
}

// With max_in_flight 1, requests that arrive while a batch is in flight wait in one batch
// past the window and go together when it is answered.
func TestMaxInFlight(t *testing.T) {
	up := newUpstream(t, sim.Config{})
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	gated := func(ctx context.Context, body []byte) (int, http.Header, []byte, error) {
		entered <- struct{}{}
		<-release
		return up.send("/v1/embeddings")(ctx, body)
	}
	ms := policy.Duration(time.Millisecond)
	b := newBatcher(t, Params{MinWindow: ms, InitialWindow: ms, MaxWindow: ms, MaxInFlight: 1}, nil)
	first := doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"a"}`), "", gated)
	<-entered
	var rest []<-chan answer
	for i := range 5 {
		rest = append(rest, doAsync(context.Background(), b, mustParse(t, openai.KindEmbedding, `{"model":"sim-llama","input":"b"}`), "", gated))
		waitWaiting(t, b, i+1)
	}
	time.Sleep(10 * time.Millisecond) // far past the window
	if s := b.Snapshot(); s.InFlight != 1 || s.Open != 1 || s.Waiting != 5 {
		t.Fatalf("snapshot %+v", s)
	}
	close(release)
	for _, ch := range append(rest, first) {
		if a := <-ch; a.status != 200 {
			t.Fatalf("%d %s", a.status, a.body)
		}
	}
	if got := up.inputsOf(t, "input"); !reflect.DeepEqual(got, []int{1, 5}) {
		t.Fatalf("upstream inputs per request %v, want [1 5]", got)
	}
}
