package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// testFilter is a stream filter (and an admitter and observer) the tests configure with
// `type: test_stream_filter`: it cuts a stream at its cut_at-th data event, strips
// `"secret":…` fields from every chunk, flags every stream, and asks the upstream for the
// set fields.
type testFilter struct {
	policy.Named
	p struct {
		CutAt int            `json:"cut_at"`
		Strip bool           `json:"strip"`
		Flag  bool           `json:"flag"`
		Set   map[string]any `json:"set"`
		Key   string         `json:"key"` // which registry entry of testFilters records
	}
	rec *filterRecord
}

// filterRecord is what one test's filter saw.
type filterRecord struct {
	mu       sync.Mutex
	watched  int
	ended    int
	events   int
	outcomes []policy.Outcome
}

var testFilters sync.Map // key → *filterRecord

func init() {
	policy.Register("test_stream_filter", func(params json.RawMessage, env policy.Env) (policy.Plugin, error) {
		f := &testFilter{Named: env.Named()}
		if err := policy.DecodeParams(params, &f.p); err != nil {
			return nil, err
		}
		r, _ := testFilters.LoadOrStore(f.p.Key, &filterRecord{})
		f.rec = r.(*filterRecord)
		return f, nil
	})
}

func (f *testFilter) Admit(context.Context, *policy.Request) (policy.Decision, error) {
	var d policy.Decision
	for k, v := range f.p.Set {
		b, _ := json.Marshal(v)
		if d.SetFields == nil {
			d.SetFields = map[string][]byte{}
		}
		d.SetFields[k] = b
	}
	return d, nil
}

func (f *testFilter) Observe(_ context.Context, _ *policy.Request, o policy.Outcome) {
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	f.rec.outcomes = append(f.rec.outcomes, o)
}

func (f *testFilter) AdminView() any {
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	return map[string]int{"watched": f.rec.watched}
}

func (f *testFilter) ReportMetrics(emit func(policy.Sample)) {
	f.rec.mu.Lock()
	n := f.rec.watched
	f.rec.mu.Unlock()
	emit(policy.Sample{Name: "sluice_test_filter_watched_total", Help: "Streams watched", Kind: policy.Counter,
		Labels: [][2]string{{"model", "m"}}, Value: float64(n)})
	emit(policy.Sample{Name: "sluice_test_filter_margin", Help: "Margins", Kind: policy.Histogram,
		Bounds: []float64{0.1, 1}, Counts: []uint64{2, 3, 1}, Count: 6, Sum: 2.5})
}

func (f *testFilter) WatchStream(*policy.Request) policy.StreamWatcher {
	f.rec.mu.Lock()
	f.rec.watched++
	f.rec.mu.Unlock()
	return &testWatcher{f: f}
}

func (f *testFilter) WatchBody(_ *policy.Request, body []byte) ([]byte, []policy.Class) {
	var flags []policy.Class
	if f.p.Flag {
		flags = []policy.Class{policy.ClassRunaway}
	}
	if f.p.Strip && bytes.Contains(body, []byte(`,"secret":1`)) {
		return bytes.Replace(body, []byte(`,"secret":1`), nil, 1), flags
	}
	return nil, flags
}

type testWatcher struct {
	f *testFilter
	n int
}

func (w *testWatcher) Event(ev policy.StreamEvent) policy.StreamAction {
	w.f.rec.mu.Lock()
	w.f.rec.events++
	w.f.rec.mu.Unlock()
	if ev.Data == nil || ev.IsDone() {
		return policy.StreamAction{}
	}
	w.n++
	if w.f.p.CutAt > 0 && w.n == w.f.p.CutAt {
		return policy.StreamAction{Cut: &policy.StreamCut{
			Class:  policy.ClassRunaway,
			Tail:   []byte("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n: sluice: cut\n\ndata: [DONE]\n\n"),
			Reason: "test cut",
		}}
	}
	if w.f.p.Strip && bytes.Contains(ev.Data, []byte(`,"secret":1`)) {
		d := bytes.Replace(ev.Data, []byte(`,"secret":1`), nil, 1)
		return policy.StreamAction{Replace: append(append([]byte("data: "), d...), "\n\n"...)}
	}
	return policy.StreamAction{}
}

func (w *testWatcher) End() []policy.Class {
	w.f.rec.mu.Lock()
	w.f.rec.ended++
	w.f.rec.mu.Unlock()
	if w.f.p.Flag {
		return []policy.Class{policy.ClassRunaway}
	}
	return nil
}

// chunk is one chat stream chunk with content tok.
func chunk(tok string, extra string) string {
	return fmt.Sprintf("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}%s,\"finish_reason\":null}]}\n\n", tok, extra)
}

// TestStreamFilters drives the route's stream filters through a real gateway and a streaming
// upstream: a cut ends the stream with the filter's tail and cancels the upstream request, a
// replacement is what the client reads, flags and the cut's class reach the Observers, and
// the fields a policy sets reach the upstream unless the client set them.
func TestStreamFilters(t *testing.T) {
	type upstreamSeen struct {
		body      string
		cancelled bool
	}
	seen := make(chan upstreamSeen, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		cancelled := false
		endless := strings.Contains(string(b), `"endless"`)
		for i := 0; i < 200; i++ { // an endless stream stops when the gateway cancels it (bounded)
			if !endless && i == 5 {
				break
			}
			extra := ""
			if i%2 == 1 {
				extra = `,"secret":1`
			}
			if _, err := io.WriteString(w, chunk(fmt.Sprintf("t%d ", i), extra)); err != nil {
				cancelled = true
				break
			}
			fl.Flush()
			if endless {
				select {
				case <-r.Context().Done():
					cancelled = true
				case <-time.After(10 * time.Millisecond):
				}
				if cancelled {
					break
				}
			}
		}
		if !cancelled {
			_, _ = io.WriteString(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
		}
		seen <- upstreamSeen{body: string(b), cancelled: cancelled}
	}))
	defer up.Close()

	cases := []struct {
		name, params, body string
		wantBody           []string // in the client's body
		wantNot            []string // not in it
		wantUpstream       []string // in the upstream's request body
		wantCancelled      bool
		wantClass          policy.Class
		wantFlags          []policy.Class
	}{
		{
			name: "cut", params: `{cut_at: 3}`, body: `{"model":"m","stream":true,"user":"endless","messages":[{"role":"user","content":"hi"}]}`,
			wantBody:      []string{`"t0 "`, `"t1 "`, `"finish_reason":"length"`, ": sluice: cut\n\ndata: [DONE]\n\n"},
			wantNot:       []string{`"t2 "`, `"error"`},
			wantCancelled: true, wantClass: policy.ClassRunaway,
		},
		{
			name: "strip", params: `{strip: true}`, body: `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			wantBody: []string{`"t1 "`, `"t4 "`, "data: [DONE]"},
			wantNot:  []string{`secret`},
		},
		{
			name: "flag", params: `{flag: true}`, body: `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			wantBody:  []string{`"t4 "`, "data: [DONE]"},
			wantFlags: []policy.Class{policy.ClassRunaway},
		},
		{
			name: "set fields", params: `{set: {logprobs: true, top_logprobs: 2}}`, body: `{"model":"m","stream":true,"top_logprobs":5,"messages":[{"role":"user","content":"hi"}]}`,
			wantBody:     []string{"data: [DONE]"},
			wantUpstream: []string{`"logprobs":true`, `"top_logprobs":5`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := t.Name()
			srv := startTestServer(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: c, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - name: r
    cluster: c
    policies:
      - type: test_stream_filter
        params: {key: %q, %s}
`, up.URL, key, tc.params[1:len(tc.params)-1]))
			status, body := post(t, http.DefaultClient, "http://"+srv.Addr()+"/v1/chat/completions", tc.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			for _, w := range tc.wantBody {
				if !strings.Contains(body, w) {
					t.Errorf("client body lacks %q:\n%s", w, body)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(body, w) {
					t.Errorf("client body has %q:\n%s", w, body)
				}
			}
			if tc.wantClass != "" && strings.Count(body, "data: [DONE]") != 1 {
				t.Errorf("a cut stream ends once:\n%s", body)
			}
			var u upstreamSeen
			select {
			case u = <-seen:
			case <-time.After(10 * time.Second):
				t.Fatal("the upstream handler did not finish")
			}
			if u.cancelled != tc.wantCancelled {
				t.Errorf("upstream request cancelled = %v, want %v", u.cancelled, tc.wantCancelled)
			}
			for _, w := range tc.wantUpstream {
				if !strings.Contains(u.body, w) {
					t.Errorf("upstream body lacks %q: %s", w, u.body)
				}
			}
			r, _ := testFilters.Load(key)
			rec := r.(*filterRecord)
			deadline := time.Now().Add(5 * time.Second)
			for {
				rec.mu.Lock()
				n := len(rec.outcomes)
				rec.mu.Unlock()
				if n > 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if rec.watched != 1 || rec.ended != 1 || rec.events == 0 {
				t.Errorf("watched %d, ended %d, events %d; want one watcher, ended once", rec.watched, rec.ended, rec.events)
			}
			if len(rec.outcomes) != 1 {
				t.Fatalf("outcomes: %+v", rec.outcomes)
			}
			o := rec.outcomes[0]
			if o.ErrorClass != tc.wantClass || o.Status != http.StatusOK {
				t.Errorf("outcome class %q status %d, want %q 200", o.ErrorClass, o.Status, tc.wantClass)
			}
			if fmt.Sprint(o.Flags) != fmt.Sprint(tc.wantFlags) {
				t.Errorf("outcome flags %v, want %v", o.Flags, tc.wantFlags)
			}
		})
	}
}

// TestWithStreamIDReplaced: a resumed stream's event carries the first stream's id, also when
// a stream filter replaced it with one plain data event; other replacements stay as they are.
func TestWithStreamIDReplaced(t *testing.T) {
	orig := []byte("data: {\"id\":\"new\",\"x\":1,\"secret\":1}\n\n")
	ev := openaiEvent(t, orig)
	id := json.RawMessage(`"first"`)
	for _, tc := range []struct {
		name     string
		raw      []byte
		replaced bool
		want     string
		contains bool
	}{
		{"not replaced", ev.Raw, false, `"id":"first"`, true},
		{"one data event", []byte("data: {\"id\":\"new\",\"x\":1}\n\n"), true, "data: {\"id\":\"first\",\"x\":1}\n\n", false},
		{"two events", []byte("data: {\"id\":\"new\"}\n\ndata: {\"id\":\"new\"}\n\n"), true, "data: {\"id\":\"new\"}\n\ndata: {\"id\":\"new\"}\n\n", false},
		{"a comment", []byte(": note\n\n"), true, ": note\n\n", false},
		{"dropped", []byte{}, true, "", false},
	} {
		got := string(withStreamID(tc.raw, tc.replaced, ev, id))
		if tc.contains && !strings.Contains(got, tc.want) || !tc.contains && got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func openaiEvent(t *testing.T, raw []byte) openai.Event {
	t.Helper()
	ev, err := openai.NewReader(bytes.NewReader(raw), 1<<16).Next()
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestPluginViewsAndMetrics: a plugin's own admin view is in GET /admin/policies with the
// contracts the gateway found on it, and its own metrics are on /metrics with its route and
// name as labels.
func TestPluginViewsAndMetrics(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, chunk("a", "")+"data: [DONE]\n\n")
	}))
	defer up.Close()
	srv := startTestServer(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: c, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - name: r
    cluster: c
    policies:
      - {type: test_stream_filter, name: mine, params: {key: %q}}
`, up.URL, t.Name()))
	if st, b := post(t, http.DefaultClient, "http://"+srv.Addr()+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`); st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	get := func(path string) string {
		resp, err := http.Get("http://" + srv.AdminAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	var view struct {
		Policies []policyJSON `json:"policies"`
	}
	if err := json.Unmarshal([]byte(get("/admin/policies")), &view); err != nil {
		t.Fatal(err)
	}
	var mine *policyJSON
	for i, p := range view.Policies {
		if p.Name == "mine" {
			mine = &view.Policies[i]
		}
	}
	if mine == nil || mine.Route != "r" || mine.Type != "test_stream_filter" ||
		fmt.Sprint(mine.Contracts) != "[admitter observer stream_filter body_filter admin_view metrics]" ||
		fmt.Sprint(mine.View) != "map[watched:1]" {
		t.Fatalf("/admin/policies: %+v", view.Policies)
	}
	m := get("/metrics")
	for _, want := range []string{
		`sluice_test_filter_watched_total{model="m",policy="mine",route="r"} 1`,
		`sluice_test_filter_margin_bucket{policy="mine",route="r",le="0.1"} 2`,
		`sluice_test_filter_margin_bucket{policy="mine",route="r",le="1"} 5`,
		`sluice_test_filter_margin_count{policy="mine",route="r"} 6`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestBodyFilters: a non-streamed answer is shown whole to the route's body filters; the
// client gets the replacement (with its own Content-Length) and the Observers the flags.
func TestBodyFilters(t *testing.T) {
	const answer = `{"id":"x","object":"chat.completion","model":"m","secret_kept":true,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"secret":1,"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(answer)))
		_, _ = io.WriteString(w, answer)
	}))
	defer up.Close()
	srv := startTestServer(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: c, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - name: r
    cluster: c
    policies:
      - {type: test_stream_filter, params: {key: %q, strip: true, flag: true}}
`, up.URL, t.Name()))
	resp, err := http.Post("http://"+srv.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := strings.Replace(answer, `,"secret":1`, "", 1)
	if resp.StatusCode != 200 || string(b) != want || resp.ContentLength != int64(len(want)) {
		t.Fatalf("%d, Content-Length %d: %s\nwant %s", resp.StatusCode, resp.ContentLength, b, want)
	}
	r, _ := testFilters.Load(t.Name())
	rec := r.(*filterRecord)
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec.mu.Lock()
		n := len(rec.outcomes)
		var flags []policy.Class
		if n > 0 {
			flags = rec.outcomes[0].Flags
		}
		rec.mu.Unlock()
		if n > 0 {
			if fmt.Sprint(flags) != "[runaway_generation]" {
				t.Errorf("outcome flags %v", flags)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no outcome")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestResumeCaptureKeepsTheFirstStreamsID: a continuation's chunks carry the first stream's
// id; a continuation never gives its own, even when the first stream had none (as before the
// capture became a stream watcher).
func TestResumeCaptureKeepsTheFirstStreamsID(t *testing.T) {
	chunk := func(id string) policy.StreamEvent {
		return policy.StreamEvent{Data: []byte(`{"id":"` + id + `","choices":[{"index":0,"delta":{"content":"x"}}]}`)}
	}
	ex := &exchange{capture: true}
	first := ex.watchStream()
	first[0].Event(chunk("chatcmpl-first"))
	ex.committed = true // the client has the first stream's headers
	first[0].Event(chunk("chatcmpl-later"))
	cont := ex.watchStream()
	cont[0].Event(chunk("chatcmpl-cont"))
	if string(ex.streamID) != `"chatcmpl-first"` {
		t.Fatalf("stream id %s, want the first stream's", ex.streamID)
	}
	bare := &exchange{capture: true}
	bare.watchStream()[0].Event(policy.StreamEvent{Data: []byte(`{"choices":[{"index":0,"delta":{"content":"x"}}]}`)})
	bare.committed = true
	bare.watchStream()[0].Event(chunk("chatcmpl-cont"))
	if bare.streamID != nil {
		t.Fatalf("a continuation gave its own id %s to a stream that had none", bare.streamID)
	}
}
