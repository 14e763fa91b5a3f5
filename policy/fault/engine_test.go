package fault

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicegw/sluice/policy/openai"
)

func ptr[T any](v T) *T { return &v }

func TestKindsTable(t *testing.T) {
	if len(Kinds) != numKinds || len(params) != numKinds {
		t.Fatalf("numKinds %d, Kinds %d, params %d", numKinds, len(Kinds), len(params))
	}
}

func TestParseHeader(t *testing.T) {
	valid := []struct {
		in   string
		want []Spec
	}{
		{"stall(after=10,for=2s); cut(after=20,mode=eof)", []Spec{
			{Kind: KindStall, AfterEvents: 10, For: Duration(2 * time.Second)},
			{Kind: KindCut, AfterEvents: 20, Mode: CutEOF}}},
		{" abort(status=429, retry_after=2s) ", []Spec{{Kind: KindAbort, Status: 429, RetryAfter: Duration(2 * time.Second)}}},
		{"delay(shape=2.1,scale=120ms,side=downstream)", []Spec{{Kind: KindDelay, Shape: 2.1, Scale: Duration(120 * time.Millisecond), Side: Downstream}}},
		{"drop(done);;drop", []Spec{{Kind: KindDrop, Mode: DropDone}, {Kind: KindDrop}}},
		{"cut(after=3,reset,cluster=llama-*,attempts=2)", []Spec{{Kind: KindCut, AfterEvents: 3, Mode: CutReset, Cluster: "llama-*", Attempts: 2}}},
		{"drift(rename=choices[].delta.content:text,remove=usage,remove=id)", []Spec{{Kind: KindDrift,
			Rename: map[string]string{"choices[].delta.content": "text"}, Remove: []string{"usage", "id"}}}},
		{"corrupt(rate=0.5,seed=9,percent=50)", []Spec{{Kind: KindCorrupt, Rate: 0.5, Seed: 9, Percent: ptr(50.0)}}},
		{"stall(after_tokens=5,for=1.5)", []Spec{{Kind: KindStall, AfterTokens: 5, For: Duration(1500 * time.Millisecond)}}},
		{"drip(gap=5ms,jitter=5ms); ttft(for=1s); malformed(at=2,invalid)", []Spec{
			{Kind: KindDrip, Gap: Duration(5 * time.Millisecond), Jitter: Duration(5 * time.Millisecond)},
			{Kind: KindTTFT, For: Duration(time.Second)}, {Kind: KindMalformed, At: 2, Mode: MalformedInvalid}}},
	}
	for _, tc := range valid {
		got, err := ParseHeader(tc.in)
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		gj, _ := json.Marshal(got)
		wj, _ := json.Marshal(tc.want)
		if string(gj) != string(wj) {
			t.Errorf("%q:\n got %s\nwant %s", tc.in, gj, wj)
		}
	}
	invalid := []struct{ in, want string }{
		{"", "no fault"},
		{"boom", `unknown fault kind "boom"`},
		{"stall(aftr=10,for=2s)", `unknown parameter "aftr"`},
		{"stall(after=ten,for=2s)", `after: invalid integer "ten"`},
		{"stall(after=10)", "for: required"},
		{"stall(after=10,for=2parsecs)", `invalid duration "2parsecs"`},
		{"cut(after=1,mode=explode)", "mode: must be eof, reset, h2reset or sse_error"},
		{"cut(after=1", "unbalanced parentheses"},
		{"abort(status=200)", "status: must be an HTTP error status"},
		{"abort(for=1s)", "for: not a parameter of abort"},
		{"drift", "a drift needs rename or remove"},
		{"drift(rename=usage)", "rename takes path:new_name"},
		{"drift(remove=choices[].)", "invalid path"},
		{"corrupt(rate=2)", "rate: must be within (0, 1]"},
		{"cut(side=downstream,cluster=x)", "cluster: applies to upstream faults only"},
		{"abort(percent=150)", "percent: must be within 0..100"},
		{"every(3)", "unknown fault kind"},
		{strings.Repeat("drop;", 17), "more than 16 faults"},
		{strings.Repeat("x", 5000), "longer than 4096"},
	}
	for _, tc := range invalid {
		_, err := ParseHeader(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.in, err, tc.want)
		}
		if err != nil && len(tc.in) < 100 && !strings.Contains(err.Error(), Header) {
			t.Errorf("%q: error %q does not name the header", tc.in, err)
		}
	}
	// Every problem is named at once, with the fault it belongs to.
	_, err := ParseHeader("stall(aftr=1); cut(mode=x); ttft")
	var p Problems
	if !errors.As(err, &p) || len(p) != 4 {
		t.Fatalf("got %v", err)
	}
	for _, want := range []string{"fault 1 (stall): unknown parameter", "fault 1 (stall): for: required", "fault 2 (cut): mode", "fault 3 (ttft): for: required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	cfg := Config{
		LogSize:         -1,
		AllowedNetworks: []string{"10.0.0.0/8", "nope", "::1", "300.1.1.1/8"},
		Faults: []Spec{
			{ID: "a", Kind: "explode", Side: "sideways", Percent: ptr(120.0), Every: 2},
			{ID: "a", Kind: KindStall, AfterEvents: 1, AfterTokens: 2, MaxActive: -1, Duration: -1},
			{Kind: KindDelay, Shape: 2},
			{Kind: KindDrift, Rename: map[string]string{"a..b": "x", "ok": `q"`}, Remove: []string{"x[]"}},
			{Kind: KindAbort, Status: 302, RetryAfter: -1, Gap: Duration(time.Second)},
			{Kind: KindCut, Side: Downstream, Attempts: 2, Mode: "explode", AfterEvents: -1},
		},
	}
	err := cfg.Validate()
	var p Problems
	if !errors.As(err, &p) {
		t.Fatalf("got %v", err)
	}
	want := []string{
		"log_size:",
		"allowed_networks[1]:",
		"allowed_networks[3]:",
		`faults[0].kind: unknown fault kind "explode"`,
		"faults[0].side:",
		"faults[0].percent:",
		"faults[0].every: set percent or every",
		"faults[1].id:",
		"faults[1].max_active:",
		"faults[1].duration:",
		"faults[1].for: required",
		"faults[1].after_tokens: set after_events or after_tokens",
		"faults[2].shape: shape and scale go together",
		`faults[3].rename["a..b"]: invalid path`,
		`faults[3].rename["ok"]: the new name`,
		"faults[3].remove[0]: invalid path",
		"faults[4].gap: not a parameter of abort",
		"faults[4].retry_after: must not be negative",
		"faults[4].status:",
		"faults[5].attempts: applies to upstream",
		"faults[5].after_events: must not be negative",
		"faults[5].mode:",
	}
	if len(p) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(p), len(want), strings.Join(p, "\n"))
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q", w)
		}
	}
	if err := (Spec{Kind: KindStall, For: Duration(time.Second)}).Validate(); err != nil {
		t.Error(err)
	}
	if _, err := New(cfg, nil, 0); err == nil {
		t.Error("New accepted an invalid config")
	}
	e, _, _ := newEngine(t, specs(t, "drop")...)
	if err := e.Set(cfg.Faults); err == nil || len(e.List()) != 1 {
		t.Error("Set accepted an invalid set, or dropped the old one")
	}
}

func TestDecodeYAMLAndJSON(t *testing.T) {
	y := `
enabled: true
allowed_networks: [10.0.0.0/8]
log_size: 50
faults:
  - {id: slow, kind: delay, shape: 2.1, scale: 120ms, percent: 5}
  - kind: stall
    after_events: 10
    for: 2s
    start: 2026-03-01T12:00:00Z
    duration: 90
    max_active: 3
  - {kind: drift, side: downstream, rename: {"choices[].delta.tool_calls[].function.arguments": args}, remove: [usage]}
`
	var c Config
	if err := yaml.Unmarshal([]byte(y), &c); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	f := c.Faults
	if len(f) != 3 || f[0].Scale.D() != 120*time.Millisecond || *f[0].Percent != 5 || f[1].For.D() != 2*time.Second ||
		f[1].Duration.D() != 90*time.Second || !f[1].Start.Equal(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) ||
		f[2].Rename["choices[].delta.tool_calls[].function.arguments"] != "args" || c.LogSize != 50 {
		t.Fatalf("decoded %+v", c)
	}
	// JSON round trip (the admin API).
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var c2 Config
	if err := json.Unmarshal(b, &c2); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(c2)
	if string(b) != string(b2) || !strings.Contains(string(b), `"scale":"120ms"`) || strings.Contains(string(b), `"start":"0001`) {
		t.Errorf("JSON round trip:\n%s\n%s", b, b2)
	}
	if err := json.Unmarshal([]byte(`{"kind":"ttft","for":"nope"}`), &Spec{}); err == nil {
		t.Error("bad duration accepted")
	}
	var s Spec
	if err := json.Unmarshal([]byte(`{"kind":"ttft","for":0.25}`), &s); err != nil || s.For.D() != 250*time.Millisecond {
		t.Errorf("seconds as a number: %v %v", s.For, err)
	}
	out, err := yaml.Marshal(Spec{Kind: KindTTFT, For: Duration(time.Second)})
	if err != nil || string(out) != "kind: ttft\nfor: 1s\n" {
		t.Errorf("yaml %q %v", out, err)
	}
}

func TestAllowsNetwork(t *testing.T) {
	c := Config{AllowedNetworks: []string{"10.0.0.0/8", "192.168.1.7", "fd00::/8", "bad"}}
	for ip, want := range map[string]bool{"10.1.2.3": true, "11.0.0.1": false, "192.168.1.7": true, "192.168.1.8": false,
		"fd00::1": true, "::1": false, "::ffff:10.0.0.1": true} {
		if got := c.AllowsNetwork(net.ParseIP(ip)); got != want {
			t.Errorf("%s: %v", ip, got)
		}
	}
	if c.AllowsNetwork(nil) {
		t.Error("nil allowed")
	}
	e, err := New(Config{AllowedNetworks: []string{"127.0.0.0/8"}}, nil, 0)
	if err != nil || !e.AllowsNetwork(net.ParseIP("127.0.0.1")) || e.Enabled() {
		t.Error("engine", err)
	}
}

func TestPercentIsAShare(t *testing.T) {
	e, _, _ := newEngine(t, Spec{Kind: KindDrop, Percent: ptr(10.0)})
	const n = 20000
	hits := 0
	for range n {
		if in := e.Plan(request("r", "m"), "chat", nil); in != nil {
			hits++
			in.Done(Outcome{Status: 200})
		}
	}
	// Binomial(20000, 0.1): sd ≈ 42; allow 5 sd.
	if math.Abs(float64(hits)-n*0.1) > 5*math.Sqrt(n*0.1*0.9) {
		t.Errorf("%d of %d, want ≈ %d", hits, n, n/10)
	}
	// 0 never fires, 100 (and the default) always.
	e2, _, _ := newEngine(t, Spec{Kind: KindDrop, Percent: ptr(0.0)})
	e3, _, _ := newEngine(t, Spec{Kind: KindDrop, Percent: ptr(100.0)}, Spec{Kind: KindDrop})
	for range 100 {
		if e2.Plan(request("r", "m"), "chat", nil) != nil {
			t.Fatal("percent 0 fired")
		}
		in := e3.Plan(request("r", "m"), "chat", nil)
		if len(in.Kinds()) != 2 {
			t.Fatal("percent 100 did not fire")
		}
		in.Done(Outcome{})
	}
}

func TestEveryNthIsExact(t *testing.T) {
	e, _, _ := newEngine(t, Spec{Kind: KindDrop, Every: 3, Route: "chat"})
	var fired []int
	for i := 1; i <= 30; i++ {
		// Requests of another route are not counted.
		if e.Plan(request("o", "m"), "embed", nil) != nil {
			t.Fatal("other route")
		}
		if in := e.Plan(request("r", "m"), "chat", nil); in != nil {
			fired = append(fired, i)
			in.Done(Outcome{Status: 200})
		}
	}
	if len(fired) != 10 || fired[0] != 3 || fired[9] != 30 {
		t.Errorf("fired on %v", fired)
	}
}

func TestEveryNthConcurrent(t *testing.T) {
	e, _, _ := newEngine(t, Spec{Kind: KindDrop, Every: 4})
	var wg sync.WaitGroup
	var mu sync.Mutex
	hits := 0
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if in := e.Plan(request("r", "m"), "chat", nil); in != nil {
					mu.Lock()
					hits++
					mu.Unlock()
					in.Done(Outcome{Status: 200})
				}
			}
		})
	}
	wg.Wait()
	if hits != 2000 {
		t.Errorf("%d hits, want 2000", hits)
	}
}

func TestMaxActive(t *testing.T) {
	e, _, _ := newEngine(t, Spec{ID: "cap", Kind: KindDrop, MaxActive: 2})
	var held []*Injection
	for range 5 {
		if in := e.Plan(request("r", "m"), "chat", nil); in != nil {
			held = append(held, in)
		}
	}
	if len(held) != 2 || e.List()[0].Active != 2 {
		t.Fatalf("%d active, list %+v", len(held), e.List())
	}
	held[0].Done(Outcome{Status: 200})
	held[0].Done(Outcome{Status: 200}) // only the first Done counts
	if e.List()[0].Active != 1 {
		t.Fatalf("active %d after Done", e.List()[0].Active)
	}
	in := e.Plan(request("r", "m"), "chat", nil)
	if in == nil {
		t.Fatal("a slot was freed")
	}
	in.Done(Outcome{})
	held[1].Done(Outcome{})
	if st := e.List()[0]; st.Active != 0 || st.Planned != 3 {
		t.Errorf("status %+v", st)
	}
}

func TestSchedule(t *testing.T) {
	clk := newClock()
	start := clk.Now().Add(time.Minute)
	e, err := New(Config{Enabled: true, Faults: []Spec{
		{ID: "window", Kind: KindDrop, Start: start, Duration: Duration(time.Minute)},
		{ID: "from-now", Kind: KindDrop, Duration: Duration(30 * time.Second)},
	}}, clk, 1)
	if err != nil {
		t.Fatal(err)
	}
	ids := func() string {
		in := e.Plan(request("r", "m"), "chat", nil)
		if in == nil {
			return ""
		}
		defer in.Done(Outcome{})
		var s []string
		for _, a := range in.faults {
			s = append(s, a.f.id)
		}
		return strings.Join(s, ",")
	}
	steps := []struct {
		advance time.Duration
		want    string
	}{{0, "from-now"}, {29 * time.Second, "from-now"}, {time.Second, ""}, {30 * time.Second, "window"},
		{59 * time.Second, "window"}, {time.Second, ""}}
	for i, s := range steps {
		clk.Advance(s.advance)
		if got := ids(); got != s.want {
			t.Errorf("step %d: %q, want %q", i, got, s.want)
		}
	}
	if st := e.List(); st[0].Scheduled || st[1].Scheduled {
		t.Errorf("scheduled after the windows: %+v", st)
	}
}

func TestFilters(t *testing.T) {
	e, _, _ := newEngine(t,
		Spec{ID: "llama", Kind: KindDrop, Model: "meta-llama/*"},
		Spec{ID: "chat", Kind: KindDrop, Route: "chat*"},
	)
	tests := []struct{ model, route, want string }{
		{"meta-llama/Llama-3.1-8B", "chat", "llama,chat"},
		{"META-LLAMA/x", "embed", "llama"},
		{"gpt-4o", "chat-v2", "chat"},
		{"gpt-4o", "embed", ""},
	}
	for _, tc := range tests {
		in := e.Plan(request("r", tc.model), tc.route, nil)
		var got []string
		if in != nil {
			for _, a := range in.faults {
				got = append(got, a.f.id)
			}
			in.Done(Outcome{})
		}
		if strings.Join(got, ",") != tc.want {
			t.Errorf("%s %s: %v, want %s", tc.model, tc.route, got, tc.want)
		}
	}
	for _, g := range []struct {
		p, n string
		want bool
	}{{"", "x", true}, {"a*c", "abbbc", true}, {"a*c", "abd", false}, {"a?c", "abc", true}, {"*-8b", "llama-3-8B", true}, {"a", "ab", false}, {"ab*", "a", false}} {
		if glob(g.p, g.n) != g.want {
			t.Errorf("glob(%q, %q) != %v", g.p, g.n, g.want)
		}
	}
}

func TestDisabledAndNil(t *testing.T) {
	e, err := New(Config{Faults: specs(t, "drop")}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if e.Plan(request("r", "m"), "chat", specs(t, "cut")) != nil {
		t.Error("a disabled engine planned")
	}
	var nilE *Engine
	var in *Injection
	if nilE.Plan(nil, "", nil) != nil || nilE.Enabled() {
		t.Error("nil engine")
	}
	// A nil Injection (the common case) is a no-op everywhere.
	rec := httptest.NewRecorder()
	body := io.NopCloser(strings.NewReader("x"))
	if ab, err := in.Before(context.Background()); ab != nil || err != nil || in.Attempt("c") != nil ||
		in.WrapDownstream(context.Background(), rec) != http.ResponseWriter(rec) || in.Kinds() != nil {
		t.Error("nil injection acted")
	}
	var at *Attempt
	if ab, err := at.Before(context.Background()); ab != nil || err != nil || at.WrapUpstream(context.Background(), body, true) != body {
		t.Error("nil attempt acted")
	}
	in.Done(Outcome{})
}

func TestAbortAndDelay(t *testing.T) {
	e, _, sl := newEngine(t, append(specs(t, "delay(for=250ms,side=downstream); abort(status=429,retry_after=1500ms,side=downstream)"),
		specs(t, "delay(shape=2.1,scale=120ms); abort(status=503,message=primary down)")...)...)
	in := e.Plan(request("req-1", "m"), "chat", nil)
	defer in.Done(Outcome{Status: 429, ClientSawError: true})
	ab, err := in.Before(context.Background())
	if err != nil || ab == nil || ab.Side != Downstream || ab.Err.Status != 429 || ab.Err.Type != "rate_limit_error" || ab.Err.RetryAfter != 1500*time.Millisecond {
		t.Fatalf("downstream abort %+v %v", ab, err)
	}
	rec := httptest.NewRecorder()
	openai.WriteError(rec, ab.Err)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "2" || !json.Valid(rec.Body.Bytes()) {
		t.Errorf("written %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if got := sl.all(); len(got) != 1 || got[0] != 250*time.Millisecond {
		t.Errorf("downstream sleeps %v", got)
	}

	at := in.Attempt("primary")
	ab, err = at.Before(context.Background())
	if err != nil || ab == nil || ab.Side != Upstream || ab.Err.Status != 503 || ab.Err.Message != "primary down" {
		t.Fatalf("upstream abort %+v %v", ab, err)
	}
	req := httptest.NewRequest("POST", "http://up/v1/chat/completions", nil)
	resp := ab.Response(req)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || resp.Request != req || resp.Header.Get("Content-Type") != "application/json" ||
		string(b) != string(ab.Err.Body()) || resp.ContentLength != int64(len(b)) || resp.Header.Get("Retry-After") != "" {
		t.Errorf("response %+v %s", resp, b)
	}
	if got := sl.all(); len(got) != 2 || got[1] <= 0 {
		t.Errorf("gamma delay %v", got)
	}
	// The upstream faults hit one attempt by default: the retry is clean.
	if in.Attempt("primary") != nil {
		t.Error("second attempt faulted")
	}
	// Cancelled during the delay.
	in2 := e.Plan(request("req-2", "m"), "chat", nil)
	defer in2.Done(Outcome{Status: 499})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := in2.Before(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled delay: %v", err)
	}
}

func TestAttemptsAndClusters(t *testing.T) {
	e, _, _ := newEngine(t,
		Spec{ID: "primary", Kind: KindAbort, Cluster: "llama-primary", Attempts: 2},
		Spec{ID: "any", Kind: KindDrop},
	)
	in := e.Plan(request("r", "m"), "chat", nil)
	defer in.Done(Outcome{Status: 200, Fallback: true})
	ids := func(a *Attempt) string {
		if a == nil {
			return ""
		}
		var s []string
		for _, x := range a.faults {
			s = append(s, x.f.id)
		}
		return strings.Join(s, ",")
	}
	for i, want := range []string{"primary,any", "primary", ""} {
		if got := ids(in.Attempt("llama-primary")); got != want {
			t.Errorf("attempt %d on the primary: %q, want %q", i+1, got, want)
		}
	}
	e2, _, _ := newEngine(t, Spec{Kind: KindAbort, Cluster: "llama-primary"})
	in2 := e2.Plan(request("r", "m"), "chat", nil)
	defer in2.Done(Outcome{})
	if ids(in2.Attempt("small-fallback")) != "" || ids(in2.Attempt("llama-primary")) == "" {
		t.Error("cluster filter")
	}
	// A mirrored copy gets only the faults that name its cluster.
	e3, _, _ := newEngine(t, Spec{ID: "named", Kind: KindAbort, Cluster: "cand*"}, Spec{ID: "any", Kind: KindDrop})
	in3 := e3.Plan(request("r", "m"), "chat", nil)
	defer in3.Done(Outcome{})
	if got := ids(in3.AttemptNamed("candidate")); got != "named" {
		t.Errorf("AttemptNamed: %q, want only the named fault", got)
	}
}

func TestHeaderFaultsAddToConfigured(t *testing.T) {
	e, _, _ := newEngine(t, Spec{ID: "cfg", Kind: KindDrop, Mode: DropDone})
	in := e.Plan(request("r", "m"), "chat", specs(t, "cut(after=2); corrupt(percent=0)"))
	if got := strings.Join(in.Kinds(), ","); got != "drop,cut" {
		t.Fatalf("kinds %s", got)
	}
	rc := in.Attempt("c").WrapUpstream(context.Background(), io.NopCloser(strings.NewReader(readFile(t, "chat.sse"))), true)
	b, _ := io.ReadAll(rc)
	if n := len(dataEvents(t, string(b))); n != 2 {
		t.Errorf("%d events", n)
	}
	in.Done(Outcome{Status: 200, ClientSawError: true})
	log := e.Log()
	if len(log) != 2 || log[0].FaultID != "cfg" || log[0].Verdict != VerdictNotTriggered || log[1].FaultID != "header" || log[1].Verdict != VerdictClientError {
		t.Errorf("log %+v", log)
	}
	// Header faults are not in the configured list.
	if len(e.List()) != 1 {
		t.Error("header fault listed")
	}
}

func TestDoneVerdictsStatsReport(t *testing.T) {
	e, clk, _ := newEngine(t,
		Spec{ID: "abort503", Kind: KindAbort},
		Spec{ID: "client-cut", Kind: KindCut, Side: Downstream, AfterEvents: 1},
	)
	run := func(id string, o Outcome, cut bool) {
		in := e.Plan(request(id, "llama"), "chat", nil)
		if ab, _ := in.Attempt("primary").Before(context.Background()); ab == nil {
			t.Fatal("no abort")
		}
		if cut {
			w := in.WrapDownstream(context.Background(), httptest.NewRecorder())
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte("data: 1\n\n"))
			_, _ = w.Write([]byte("data: 2\n\n"))
		}
		clk.Advance(time.Second)
		in.Done(o)
	}
	run("r1", Outcome{Status: 200, Fallback: true, Attempts: 2, Cluster: "fallback"}, true)
	run("r2", Outcome{Status: 503, ErrorClass: "upstream_5xx", ClientSawError: true, BreakerOpened: true}, false)
	run("r3", Outcome{Status: 200, ClientSawError: true}, false) // an in-band error after the first byte
	run("r4", Outcome{Status: 499}, false)

	log := e.Log()
	var verdicts []string
	for _, r := range log {
		verdicts = append(verdicts, r.RequestID+":"+r.FaultID+":"+r.Verdict)
	}
	want := "r1:abort503:survived r1:client-cut:to_client r2:abort503:client_error r2:client-cut:not_triggered " +
		"r3:abort503:client_error r3:client-cut:not_triggered r4:abort503:client_gone r4:client-cut:not_triggered"
	if strings.Join(verdicts, " ") != want {
		t.Errorf("verdicts\n%s\nwant\n%s", strings.Join(verdicts, " "), want)
	}
	if r := log[0]; r.Route != "chat" || r.Model != "llama" || r.Kind != KindAbort || r.Side != Upstream || !r.Fallback ||
		r.Attempts != 2 || r.Cluster != "fallback" || !r.Time.Equal(newClock().Now().Add(time.Second)) {
		t.Errorf("record %+v", r)
	}
	st := e.Stats()
	if st.Injected != 5 || st.Survived != 1 || st.ClientErrors != 2 || len(st.Kinds) != 2 ||
		st.Kinds[0].Kind != KindAbort || st.Kinds[0].Injected != 4 || st.Kinds[1].Kind != KindCut || st.Kinds[1].Side != Downstream {
		t.Errorf("stats %+v", st)
	}
	if l := e.List(); l[0].Fired != 4 || l[1].Fired != 1 || l[0].Planned != 4 || l[0].Active != 0 {
		t.Errorf("list %+v", l)
	}
	rep := e.Report()
	if len(rep.Rows) != 2 || rep.Total.Injected != 5 || rep.Total.Survived != 1 || rep.Total.ClientErrors != 2 ||
		rep.Total.ClientGone != 1 || rep.Total.ToClient != 1 || rep.Total.Fallback != 2 || rep.Total.BreakerOpened != 1 || rep.Total.NotTriggered != 3 {
		t.Errorf("report %+v", rep)
	}
	s := rep.String()
	if !strings.Contains(s, "abort503") || !strings.Contains(s, "5 faults injected, 1 survived with the client unaware (4 upstream, 1 downstream)") {
		t.Errorf("report:\n%s", s)
	}
	t.Logf("\n%s", s)
}

func TestLogIsBounded(t *testing.T) {
	e, err := New(Config{Enabled: true, LogSize: 3, Faults: []Spec{{Kind: KindDrop}}}, newClock(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		e.Plan(request(id, "m"), "chat", nil).Done(Outcome{Status: 200})
	}
	var ids []string
	for _, r := range e.Log() {
		ids = append(ids, r.RequestID)
	}
	if strings.Join(ids, "") != "cde" {
		t.Errorf("log %v", ids)
	}
	e2, _, _ := newEngine(t, Spec{Kind: KindDrop})
	e2.Plan(request("x", "m"), "chat", nil).Done(Outcome{})
	if len(e2.Log()) != 1 || len(e2.log.recs) != DefaultLogSize {
		t.Errorf("default size %d", len(e2.log.recs))
	}
}

func TestSetAddRemoveClear(t *testing.T) {
	e, _, _ := newEngine(t)
	if err := e.Set(specs(t, "drop; cut(after=2)")); err != nil {
		t.Fatal(err)
	}
	id, err := e.Add(Spec{ID: "mine", Kind: KindTTFT, For: Duration(time.Second)})
	if err != nil || id != "mine" {
		t.Fatal(id, err)
	}
	if _, err := e.Add(Spec{ID: "mine", Kind: KindDrop}); err == nil {
		t.Error("duplicate id added")
	}
	if _, err := e.Add(Spec{Kind: KindTTFT}); err == nil {
		t.Error("invalid fault added")
	}
	l := e.List()
	if len(l) != 3 || l[0].ID != "f1" || l[1].ID != "f2" || l[2].ID != "mine" || l[1].Spec.Kind != KindCut {
		t.Fatalf("list %+v", l)
	}
	if !e.Remove("f1") || e.Remove("f1") || len(e.List()) != 2 {
		t.Error("remove")
	}

	// The kill switch: nothing new, and a stream in flight stops being faulted.
	in := e.Plan(request("r", "m"), "chat", nil)
	defer in.Done(Outcome{Status: 200})
	rc := in.Attempt("c").WrapUpstream(context.Background(), io.NopCloser(strings.NewReader(readFile(t, "chat.sse"))), true)
	buf := make([]byte, 1)
	if _, err := rc.Read(buf); err != nil {
		t.Fatal(err)
	}
	e.Clear()
	rest, err := io.ReadAll(rc)
	if err != nil || len(dataEvents(t, string(buf)+string(rest))) != 11 {
		t.Errorf("after Clear: %v, %d events", err, len(dataEvents(t, string(buf)+string(rest))))
	}
	if len(e.List()) != 0 || e.Plan(request("r", "m"), "chat", nil) != nil {
		t.Error("faults left after Clear")
	}
}

func TestPlanAllocatesNothingWhenNoFaultApplies(t *testing.T) {
	r := request("r", "gpt-4o")
	cases := map[string][]Spec{
		"none":           nil,
		"other route":    {{Kind: KindDrop, Route: "embed"}},
		"other model":    {{Kind: KindDrop, Model: "llama*"}},
		"percent missed": {{Kind: KindDrop, Percent: ptr(0.0001)}},
		"every missed":   {{Kind: KindDrop, Every: 1 << 30}},
		"out of window":  {{Kind: KindDrop, Start: newClock().Now().Add(time.Hour)}},
	}
	for name, faults := range cases {
		e, _, _ := newEngine(t, faults...)
		if n := testing.AllocsPerRun(1000, func() {
			if e.Plan(r, "chat", nil) != nil {
				t.Fatal("planned")
			}
		}); n != 0 {
			t.Errorf("%s: %v allocs", name, n)
		}
	}
}

func BenchmarkPlanNoMatch(b *testing.B) {
	r := request("r", "gpt-4o")
	for _, tc := range []struct {
		name   string
		faults []Spec
	}{
		{"none", nil},
		{"4-faults-filtered", []Spec{{Kind: KindDrop, Route: "embed"}, {Kind: KindDrop, Model: "llama*"},
			{Kind: KindDrop, Percent: ptr(0.0)}, {Kind: KindCut, Every: 1 << 30}}}, // percent 0: matches, never fires
	} {
		b.Run(tc.name, func(b *testing.B) {
			e, _, _ := newEngine(b, tc.faults...)
			b.ReportAllocs()
			for b.Loop() {
				if e.Plan(r, "chat", nil) != nil {
					b.Fatal("planned")
				}
			}
		})
	}
}

// BenchmarkWrapUpstream reads a 1000-event stream through WrapUpstream (ns/op is per
// event), against the plain openai.Reader the gateway uses anyway.
func BenchmarkWrapUpstream(b *testing.B) {
	chat := readFile(b, "chat.sse")
	ev := events(b, chat)
	var sb strings.Builder
	for range 1000 / 7 {
		for _, x := range ev[2:9] { // the content events
			sb.WriteString(x)
		}
	}
	stream := sb.String()
	n := len(dataEvents(b, stream))
	run := func(b *testing.B, wrap func(io.ReadCloser) io.ReadCloser) {
		b.ReportAllocs()
		for b.Loop() {
			rd := openai.NewReader(wrap(io.NopCloser(strings.NewReader(stream))), 0)
			for {
				if _, err := rd.Next(); err != nil {
					break
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
	}
	b.Run("plain", func(b *testing.B) { run(b, func(r io.ReadCloser) io.ReadCloser { return r }) })
	for _, h := range []string{"drop(done)", "stall(after_tokens=100000,for=1s)", "corrupt", "drift(remove=usage)"} {
		b.Run(h, func(b *testing.B) {
			e, _, _ := newEngine(b, specs(b, h)...)
			run(b, func(r io.ReadCloser) io.ReadCloser {
				in := e.Plan(request("r", "m"), "chat", nil)
				defer in.Done(Outcome{})
				return in.Attempt("c").WrapUpstream(context.Background(), r, true)
			})
		})
	}
}

// TestCompileThenInstall: compiling a set checks it whole and changes nothing (a config
// generation carries it until it is installed with its routes); installing replaces the set.
func TestCompileThenInstall(t *testing.T) {
	e, _, _ := newEngine(t)
	if err := e.Set(specs(t, "drop")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Compile([]Spec{{Kind: KindTTFT}, {Kind: "nope"}}); err == nil || len(err.(Problems)) != 2 {
		t.Fatalf("an invalid set compiled, or not every problem was said: %v", err)
	}
	c, err := e.Compile(specs(t, "cut(after=2); stall(for=1s)"))
	if err != nil {
		t.Fatal(err)
	}
	if l := e.List(); len(l) != 1 || l[0].Spec.Kind != KindDrop {
		t.Fatalf("Compile changed the installed set: %+v", l)
	}
	e.Install(c)
	if l := e.List(); len(l) != 2 || l[0].Spec.Kind != KindCut || l[1].Spec.Kind != KindStall {
		t.Fatalf("after Install: %+v", l)
	}
}
