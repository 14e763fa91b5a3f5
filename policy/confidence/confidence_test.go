package confidence

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/clocktest"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/test/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newPolicy(t testing.TB, p Params) *Policy {
	t.Helper()
	pol, err := New(p, policy.Env{Route: "chat", Name: policy.TypedName{Type: "confidence", Name: "confidence"},
		Clock: clocktest.New(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// request parses body as the gateway does and names the request id.
func request(t testing.TB, kind openai.Kind, body, id string) *policy.Request {
	t.Helper()
	r, err := openai.ParseRequest(kind, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return &policy.Request{Request: r, ID: id, Route: "chat"}
}

const (
	chatReq   = `{"model":"sim-llama","messages":[{"role":"user","content":"tell me about rivers"}],"max_tokens":48,"stream":true}`
	compReq   = `{"model":"sim-llama","prompt":"once upon a time","max_tokens":40,"stream":true}`
	chatAsked = `{"model":"sim-llama","messages":[{"role":"user","content":"tell me about rivers"}],"max_tokens":48,"stream":true,"logprobs":true,"top_logprobs":3}`
)

func TestParams(t *testing.T) {
	if _, err := New(Params{}, policy.Env{}); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	err := Params{Sample: 1.5, TopLogprobs: 1, HighEntropy: -1, LowMargin: 2, SpanTokens: -3, MaxModels: 65,
		Models: []string{"", "other", "a\x01"}}.Validate()
	for _, want := range []string{"sample: 1.5", "top_logprobs: 1", "high_entropy: -1", "low_margin: 2", "span_tokens: -3",
		"max_models: 65", "models[0]", `models[1]: "other"`, "models[2]: control"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v lacks %q", err, want)
		}
	}
	if err := (Params{Sample: math.NaN()}).Validate(); err == nil {
		t.Error("NaN sample accepted")
	}
	pl, err := policy.Build(policy.Spec{Type: "confidence", Params: map[string]any{"sample": 0.25, "top_logprobs": 8}}, policy.Env{Route: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	p := pl.(*Policy)
	if p.Params().Sample != 0.25 || p.Params().TopLogprobs != 8 || p.Params().SpanTokens != DefaultSpanTokens {
		t.Errorf("params %+v", p.Params())
	}
	var _ policy.StreamFilter = p
	var _ policy.Admitter = p
	if _, err := policy.Build(policy.Spec{Type: "confidence", Params: map[string]any{"sampel": 1}}, policy.Env{}); err == nil {
		t.Error("an unknown param accepted")
	}
}

func TestAdmitAsks(t *testing.T) {
	p := newPolicy(t, Params{Sample: 1})
	for _, tc := range []struct {
		name string
		kind openai.Kind
		body string
		want map[string]string
	}{
		{"chat", openai.KindChat, chatReq, map[string]string{"logprobs": "true", "top_logprobs": "5"}},
		{"completions", openai.KindCompletion, compReq, map[string]string{"logprobs": "5"}},
		{"not streamed", openai.KindChat, strings.Replace(chatReq, `"stream":true`, `"stream":false`, 1), map[string]string{"logprobs": "true", "top_logprobs": "5"}},
		{"asked", openai.KindChat, chatAsked, nil},
		{"refused by the client", openai.KindChat, strings.Replace(chatReq, `"stream":true`, `"stream":true,"logprobs":false`, 1), nil},
		{"top_logprobs named", openai.KindChat, strings.Replace(chatReq, `"stream":true`, `"stream":true,"top_logprobs":null`, 1), nil},
		{"echo", openai.KindCompletion, strings.Replace(compReq, `"stream":true`, `"stream":true,"echo":true`, 1), nil},
		{"responses", openai.KindResponses, `{"model":"m","input":"x","stream":true}`, nil},
		{"embeddings", openai.KindEmbedding, `{"model":"m","input":"x"}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := request(t, tc.kind, tc.body, "req-1")
			d, err := p.Admit(context.Background(), r)
			if err != nil || d.Reject != nil {
				t.Fatalf("%+v %v", d, err)
			}
			if len(d.SetFields) != len(tc.want) {
				t.Fatalf("fields %v, want %v", d.SetFields, tc.want)
			}
			body := []byte(tc.body)
			for k, v := range d.SetFields {
				if tc.want[k] != string(v) || !json.Valid(v) {
					t.Errorf("%s: %s, want %s", k, v, tc.want[k])
				}
				if body, err = openai.SetField(body, k, v); err != nil {
					t.Fatal(err)
				}
			}
			// The watcher strips exactly when the policy asked, and watches what the client
			// asked for itself.
			w := p.WatchStream(r)
			r2, err := openai.ParseRequest(tc.kind, body)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want != nil && (w == nil || !w.(*watcher).strip || !r2.Logprobs):
				t.Errorf("asked: watcher %v, the body asks %v", w, r2.Logprobs)
			case tc.want == nil && w != nil && (w.(*watcher).strip || !r.Logprobs):
				t.Errorf("not asked, yet watched: %+v", w)
			}
		})
	}
}

func TestSamplingShareAndAgreement(t *testing.T) {
	p := newPolicy(t, Params{Sample: 0.2})
	other, err := New(Params{Sample: 0.2}, policy.Env{Route: "other"})
	if err != nil {
		t.Fatal(err)
	}
	n, both := 0, 0
	const total = 20000
	for i := range total {
		r := request(t, openai.KindChat, chatReq, fmt.Sprintf("req-%d", i))
		d, _ := p.Admit(context.Background(), r)
		w := p.WatchStream(r)
		asked := d.SetFields != nil
		if asked != (w != nil) {
			t.Fatalf("request %d: Admit asked %v, WatchStream watches %v", i, asked, w != nil)
		}
		if asked {
			n++
			if d2, _ := other.Admit(context.Background(), r); d2.SetFields != nil {
				both++
			}
		}
		if again, _ := p.Admit(context.Background(), r); (again.SetFields != nil) != asked {
			t.Fatalf("request %d: not deterministic", i)
		}
	}
	// 20000 draws at 0.2: 4000 ± 57 (one standard deviation).
	if n < 3700 || n > 4300 {
		t.Errorf("%d of %d sampled at 0.2", n, total)
	}
	// Another route's policy samples other requests (its own salt): about 0.2 of these.
	if both < n/10 || both > n*3/10 {
		t.Errorf("%d of %d sampled by both routes", both, n)
	}
	if s := p.Snapshot(); s.Sampled != uint64(2*n) {
		t.Errorf("sampled counter %d, want %d", s.Sampled, 2*n)
	}
	if d, _ := p.Admit(context.Background(), request(t, openai.KindChat, chatReq, "")); d.SetFields != nil {
		t.Error("a request without an id sampled below 1")
	}
}

// stream sends body to the simulator and returns its events as the relay hands them to a
// watcher (copied: a real relay's slices are valid only during the call).
func stream(t testing.TB, url, path string, body []byte) []policy.StreamEvent {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	rd := openai.NewReader(resp.Body, 0)
	var out []policy.StreamEvent
	for range 10000 {
		ev, err := rd.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		raw := bytes.Clone(ev.Raw)
		se := policy.StreamEvent{Raw: raw}
		if ev.Data != nil {
			i := bytes.Index(raw, ev.Data)
			se.Data = raw[i : i+len(ev.Data)]
		}
		if ev.Name != nil {
			se.Name = bytes.Clone(ev.Name)
		}
		out = append(out, se)
	}
	t.Fatal("stream too long")
	return nil
}

// relay feeds events to w as the relay does and returns what the client gets.
func relay(w policy.StreamWatcher, evs []policy.StreamEvent) []byte {
	var out []byte
	for _, ev := range evs {
		a := w.Event(ev)
		if a.Replace != nil {
			out = append(out, a.Replace...)
		} else {
			out = append(out, ev.Raw...)
		}
	}
	w.End()
	return out
}

func startSim(t testing.TB, cfg sim.Config) *httptest.Server {
	t.Helper()
	s := sim.New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return ts
}

var (
	logprobsValue = regexp.MustCompile(`"logprobs":\{.*?\]\}(,"finish_reason")`)
	idAndCreated  = regexp.MustCompile(`"id":"[a-z]+-[0-9a-f]+","object":"([a-z._]+)","created":[0-9]+`)
)

// TestStripSampled runs sampled chat and completions streams through the watcher: the client
// gets the answer the same request without logprobs gets, byte for byte but for the answer's
// id and time, the official client decodes it, and the series counts every token.
func TestStripSampled(t *testing.T) {
	ts := startSim(t, sim.Config{TokensPerEvent: 2})
	for _, tc := range []struct {
		name, path, body string
		kind             openai.Kind
	}{
		{"chat", "/v1/chat/completions", chatReq, openai.KindChat},
		{"completions", "/v1/completions", compReq, openai.KindCompletion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Params{Sample: 1, TopLogprobs: 5})
			r := request(t, tc.kind, tc.body, "req-strip")
			d, _ := p.Admit(context.Background(), r)
			body := []byte(tc.body)
			for k, v := range d.SetFields {
				body, _ = openai.SetField(body, k, v)
			}
			evs := stream(t, ts.URL, tc.path, body)
			w := p.WatchStream(r)
			got := relay(w, evs)

			var raw []byte
			for _, ev := range evs {
				raw = append(raw, ev.Raw...)
			}
			if !bytes.Contains(raw, []byte(`"top_logprobs"`)) {
				t.Fatal("the upstream sent no logprobs")
			}
			if bytes.Contains(got, []byte(`top_logprobs`)) || bytes.Contains(got, []byte(`token_logprobs`)) {
				t.Fatalf("logprobs reached the client:\n%s", got)
			}
			// Byte for byte what the upstream sent, each logprobs object become null.
			if want := logprobsValue.ReplaceAll(raw, []byte(`"logprobs":null$1`)); !bytes.Equal(got, want) {
				t.Fatalf("stripped stream\n%s\nwant\n%s", got, want)
			}
			// ...which is what the same request without logprobs gets.
			plain := stream(t, ts.URL, tc.path, []byte(tc.body))
			var plainRaw []byte
			for _, ev := range plain {
				plainRaw = append(plainRaw, ev.Raw...)
			}
			norm := func(b []byte) []byte { return idAndCreated.ReplaceAll(b, []byte(`"id":"X","object":"$1","created":0`)) }
			if !bytes.Equal(norm(got), norm(plainRaw)) {
				t.Fatalf("stripped stream\n%s\ndiffers from the plain one\n%s", norm(got), norm(plainRaw))
			}
			s := p.Snapshot()
			if len(s.Series) != 1 || s.Series[0].Answers[SourceSampled] != 1 || s.Series[0].Tokens == 0 ||
				s.Series[0].Entropy.Count != s.Series[0].Tokens || s.Series[0].Margin.Count != s.Series[0].Tokens ||
				s.Series[0].AnswerEntropy.Count != 1 || s.StrippedEvents == 0 || s.Series[0].Model != "sim-llama" || s.Series[0].Route != "chat" {
				t.Errorf("snapshot %+v", s)
			}
		})
	}
}

// TestStrippedOpenAIClient: the official client reads a stripped stream as it reads one that
// never had logprobs: the same text, and no logprobs.
func TestStrippedOpenAIClient(t *testing.T) {
	ts := startSim(t, sim.Config{})
	p := newPolicy(t, Params{Sample: 1})
	r := request(t, openai.KindChat, chatReq, "req-sdk")
	d, _ := p.Admit(context.Background(), r)
	body := []byte(chatReq)
	for k, v := range d.SetFields {
		body, _ = openai.SetField(body, k, v)
	}
	stripped := relay(p.WatchStream(r), stream(t, ts.URL, "/v1/chat/completions", body))
	replay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(stripped)
	}))
	defer replay.Close()
	client := oai.NewClient(option.WithBaseURL(replay.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	st := client.Chat.Completions.NewStreaming(context.Background(), oai.ChatCompletionNewParams{Model: "sim-llama",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("tell me about rivers")}})
	var acc oai.ChatCompletionAccumulator
	for st.Next() {
		c := st.Current()
		if !acc.AddChunk(c) {
			t.Fatalf("chunk refused: %s", c.RawJSON())
		}
		for _, ch := range c.Choices {
			if len(ch.Logprobs.Content) > 0 || ch.Logprobs.JSON.Content.Valid() {
				t.Fatalf("logprobs decoded: %s", c.RawJSON())
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	want := plainText(t, ts.URL)
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != want || acc.Choices[0].FinishReason == "" {
		t.Fatalf("accumulated %+v, want %q", acc.Choices, want)
	}
}

func plainText(t *testing.T, url string) string {
	t.Helper()
	b := strings.Replace(chatReq, `"stream":true`, `"stream":false`, 1)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("%v %+v", err, out)
	}
	return out.Choices[0].Message.Content
}

// TestClientAskedUntouched: an answer whose client asked for logprobs is read, never changed.
func TestClientAskedUntouched(t *testing.T) {
	ts := startSim(t, sim.Config{})
	p := newPolicy(t, Params{Sample: 1})
	r := request(t, openai.KindChat, chatAsked, "req-asked")
	if d, _ := p.Admit(context.Background(), r); d.SetFields != nil {
		t.Fatalf("asked again: %v", d.SetFields)
	}
	evs := stream(t, ts.URL, "/v1/chat/completions", []byte(chatAsked))
	w := p.WatchStream(r)
	for _, ev := range evs {
		if a := w.Event(ev); a.Replace != nil || a.Cut != nil {
			t.Fatalf("changed an event the client asked for: %+v", a)
		}
	}
	if flags := w.End(); flags != nil {
		t.Errorf("flags %v", flags)
	}
	s := p.Snapshot()
	if len(s.Series) != 1 || s.Series[0].Answers[SourceClient] != 1 || s.Series[0].Answers[SourceSampled] != 0 || s.StrippedEvents != 0 {
		t.Errorf("snapshot %+v", s)
	}
	// A stream without logprobs is not watched at all.
	if w := p.WatchStream(request(t, openai.KindChat, strings.Replace(chatReq, `"stream":true`, `"stream":true,"logprobs":false`, 1), "x")); w != nil {
		t.Error("watching a stream without logprobs")
	}
}

// TestResponsesAsked: a Responses stream whose client asked is read from its deltas.
func TestResponsesAsked(t *testing.T) {
	p := newPolicy(t, Params{})
	r := request(t, openai.KindResponses, `{"model":"gpt","input":"x","stream":true,"top_logprobs":2,"include":["message.output_text.logprobs"]}`, "r")
	w := p.WatchStream(r)
	if w == nil {
		t.Fatal("not watched")
	}
	b, err := os.ReadFile("../openai/testdata/logprobs_responses.sse")
	if err != nil {
		t.Fatal(err)
	}
	rd := openai.NewReader(bytes.NewReader(b), 0)
	for range 100 {
		ev, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if a := w.Event(policy.StreamEvent{Raw: ev.Raw, Name: ev.Name, Data: ev.Data}); a.Replace != nil {
			t.Fatal("a Responses event replaced")
		}
	}
	w.End()
	if s := p.Snapshot().Series; len(s) != 1 || s[0].Tokens != 2 || s[0].Model != "gpt" {
		t.Fatalf("series %+v", s)
	}
}

// chunk is a chat chunk of one token whose two alternatives have probabilities p1 and p2.
func chunk(choice int, p1, p2 float64) []byte {
	return []byte(fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":%d,"delta":{"content":" x"},"logprobs":{"content":[{"token":" x","logprob":%g,"bytes":[32,120],"top_logprobs":[{"token":" x","logprob":%g,"bytes":[32,120]},{"token":" y","logprob":%g,"bytes":[32,121]}]}]},"finish_reason":null}]}`,
		choice, math.Log(p1), math.Log(p1), math.Log(p2)))
}

func feed(w policy.StreamWatcher, choice int, sure bool) {
	p1, p2 := 0.99, 0.01
	if !sure {
		p1, p2 = 0.5, 0.45 // margin 0.05 < 0.1
	}
	d := chunk(choice, p1, p2)
	w.Event(policy.StreamEvent{Raw: append(append([]byte("data: "), d...), "\n\n"...), Data: d})
}

func TestSpans(t *testing.T) {
	p := newPolicy(t, Params{SpanTokens: 8})
	w := p.WatchStream(request(t, openai.KindChat, chatAsked, strings.Repeat("i", 300)))
	plan := []struct {
		choice int
		sure   bool
		n      int
	}{
		{0, true, 5}, {0, false, 10}, {0, true, 3}, // a span of 10 at 5
		{0, false, 7}, {0, true, 1}, // 7: not one
		{1, false, 4}, {0, false, 2}, {1, false, 4}, // choice 1's run goes on across choice 0's tokens
		{1, true, 1},
		{0, false, 9}, // choice 0's run of 2+9 runs to the end: closed by End
	}
	for _, s := range plan {
		for range s.n {
			feed(w, s.choice, s.sure)
		}
	}
	w.End()
	w.End() // once only
	s := p.Snapshot()
	if len(s.Series) != 1 {
		t.Fatalf("series %+v", s.Series)
	}
	se := s.Series[0]
	if se.Spans != 3 || se.AnswersWithSpans != 2 || se.Answers[SourceClient] != 2 || se.UnsureTokens != 10+7+8+2+9 || se.Tokens != 46 {
		t.Errorf("series %+v", se)
	}
	if len(s.RecentSpans) != 3 {
		t.Fatalf("spans %+v", s.RecentSpans)
	}
	// Newest first: choice 0's last run (positions 26 to 36), then choice 1's, then the first.
	for i, want := range []struct{ choice, start, tokens int }{{0, 26, 11}, {1, 0, 8}, {0, 5, 10}} {
		got := s.RecentSpans[i]
		if got.Choice != want.choice || got.Start != want.start || got.Tokens != want.tokens || got.MinMargin > 0.051 ||
			got.Route != "chat" || got.Model != "sim-llama" || len(got.RequestID) != maxRequestID || got.Source != SourceClient {
			t.Errorf("span %d: %+v, want %+v", i, got, want)
		}
	}
	// The ring keeps the last RecentSpans.
	for range RecentSpans + 5 {
		w := p.WatchStream(request(t, openai.KindChat, chatAsked, "x"))
		for range 8 {
			feed(w, 0, false)
		}
		w.End()
	}
	if s := p.Snapshot(); len(s.RecentSpans) != RecentSpans || s.Series[0].Spans != 3+RecentSpans+5 {
		t.Errorf("%d spans listed, %d counted", len(s.RecentSpans), s.Series[0].Spans)
	}
}

func TestModelSeriesBounded(t *testing.T) {
	run := func(p *Policy, model string) {
		body := strings.Replace(chatAsked, `"sim-llama"`, `"`+model+`"`, 1)
		w := p.WatchStream(request(t, openai.KindChat, body, "x"))
		feed(w, 0, true)
		w.End()
	}
	p := newPolicy(t, Params{MaxModels: 2})
	for _, m := range []string{"a", "b", "c", "a", strings.Repeat("z", 200), "other", "d"} {
		run(p, m)
	}
	got := map[string]uint64{}
	for _, s := range p.Snapshot().Series {
		got[s.Model] = s.Tokens
	}
	if len(got) != 3 || got["a"] != 2 || got["b"] != 1 || got[OtherModel] != 4 {
		t.Errorf("series %v", got)
	}
	// The models param names the series; a glob's series is the glob's.
	p = newPolicy(t, Params{Models: []string{"llama-3*", "qwen"}})
	for _, m := range []string{"llama-3-8b", "llama-3-70b", "qwen", "qwen2", "mistral"} {
		run(p, m)
	}
	got = map[string]uint64{}
	for _, s := range p.Snapshot().Series {
		got[s.Model] = s.Tokens
	}
	if len(got) != 3 || got["llama-3*"] != 2 || got["qwen"] != 1 || got[OtherModel] != 2 {
		t.Errorf("series %v", got)
	}
	// A stream that carried no logprobs makes no series.
	w := p.WatchStream(request(t, openai.KindChat, strings.Replace(chatAsked, "sim-llama", "never", 1), "y"))
	w.Event(policy.StreamEvent{Raw: []byte("data: [DONE]\n\n"), Data: []byte("[DONE]")})
	w.End()
	if n := len(p.Snapshot().Series); n != 3 {
		t.Errorf("%d series", n)
	}
}

// TestMultilineData: an event whose data spans lines is written again as one data line.
func TestMultilineData(t *testing.T) {
	p := newPolicy(t, Params{Sample: 1})
	w := p.WatchStream(request(t, openai.KindChat, chatReq, "m"))
	d := chunk(0, 0.9, 0.05)
	half := bytes.Index(d, []byte(`"choices":[`)) + len(`"choices":[`) // a split outside strings: the newline is white space
	raw := []byte("event: message\ndata: " + string(d[:half]) + "\ndata: " + string(d[half:]) + "\n\n")
	joined := append(append(bytes.Clone(d[:half]), '\n'), d[half:]...)
	a := w.Event(policy.StreamEvent{Raw: raw, Name: []byte("message"), Data: joined})
	want := "event: message\ndata: " + logprobsValue.ReplaceAllString(string(joined), `"logprobs":null$1`) + "\n\n"
	if string(a.Replace) != want {
		t.Fatalf("replace\n%q\nwant\n%q", a.Replace, want)
	}
}

func TestDataOffset(t *testing.T) {
	for _, tc := range []struct {
		raw, data string
		want      int
	}{
		{"data: {}\n\n", "{}", 6},
		{"data:{}\n\n", "{}", 5},
		{"event: {}\ndata: {}\n\n", "{}", 16},
		{": {} comment\r\ndata: {}\r\n\r\n", "{}", 20},
		{"data: {\ndata: }\n\n", "{\n}", -1},
		{"id: 1\n\n", "{}", -1},
	} {
		if got := dataOffset([]byte(tc.raw), []byte(tc.data)); got != tc.want {
			t.Errorf("%q in %q: %d, want %d", tc.data, tc.raw, got, tc.want)
		}
	}
}

// TestLessConfidentModel: the series tell a flatter model from a surer one.
func TestLessConfidentModel(t *testing.T) {
	mean := func(temp float64) (entropy, margin float64, spans uint64) {
		ts := startSim(t, sim.Config{LogprobTemperature: temp})
		p := newPolicy(t, Params{Sample: 1})
		for i := range 20 {
			body := strings.Replace(chatReq, "rivers", fmt.Sprintf("rivers %d", i), 1)
			r := request(t, openai.KindChat, body, fmt.Sprint(i))
			d, _ := p.Admit(context.Background(), r)
			b := []byte(body)
			for k, v := range d.SetFields {
				b, _ = openai.SetField(b, k, v)
			}
			relay(p.WatchStream(r), stream(t, ts.URL, "/v1/chat/completions", b))
		}
		s := p.Snapshot().Series[0]
		return s.Entropy.Mean(), s.Margin.Mean(), s.Spans
	}
	h1, m1, _ := mean(1)
	h2, m2, _ := mean(2)
	if !(h2 > h1+0.1 && m2 < m1-0.05) {
		t.Errorf("temperature 2: entropy %.3f margin %.3f; 1: %.3f %.3f", h2, m2, h1, m1)
	}
}

// BenchmarkWatcher is the watcher's cost per token on the simulator's chat chunks (one token
// a chunk, top_logprobs 5): read only (the client asked), and read and stripped (sampled).
func BenchmarkWatcher(b *testing.B) {
	ts := startSim(b, sim.Config{})
	body := []byte(strings.Replace(chatAsked, `"top_logprobs":3`, `"top_logprobs":5`, 1))
	body, _ = openai.SetField(body, "max_tokens", []byte("256"))
	evs := stream(b, ts.URL, "/v1/chat/completions", body)
	tokens := 0
	var sc openai.LogprobScanner
	for _, ev := range evs {
		if ev.Data != nil {
			tokens += sc.ScanChunk(ev.Data, nil)
		}
	}
	for _, mode := range []struct {
		name, body string
	}{{"client", string(body)}, {"sampled", chatReq}} {
		b.Run(mode.name, func(b *testing.B) {
			p := newPolicy(b, Params{Sample: 1})
			r := request(b, openai.KindChat, mode.body, "bench")
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				w := p.WatchStream(r)
				for _, ev := range evs {
					w.Event(ev)
				}
				w.End()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*tokens), "cpu-ns/token")
			b.ReportMetric(float64(tokens), "tokens/stream")
		})
	}
}

// TestWatchBody: a non-streamed answer is read whole; when the policy asked for its logprobs
// the client gets the body with every choice's logprobs null and every other byte kept, and
// when the client asked, the body as it is. Both are counted.
func TestWatchBody(t *testing.T) {
	body := `{"id":"c1","object":"chat.completion","model":"sim-llama","choices":[{"index":0,"message":{"role":"assistant","content":"hi there"},` +
		`"logprobs":{"content":[{"token":"hi","logprob":-0.1,"bytes":null,"top_logprobs":[{"token":"hi","logprob":-0.1},{"token":"yo","logprob":-2.5}]},` +
		`{"token":" there","logprob":-0.7,"bytes":null,"top_logprobs":[{"token":" there","logprob":-0.7},{"token":" you","logprob":-0.9}]}]},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`
	stripped := body[:strings.Index(body, `"logprobs":`)] + `"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`
	for _, tc := range []struct {
		name, req string
		want      string // "" for no replacement
	}{
		{"sampled", strings.Replace(chatReq, `"stream":true`, `"stream":false`, 1), stripped},
		{"client asked", strings.Replace(chatAsked, `"stream":true`, `"stream":false`, 1), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Params{Sample: 1})
			rep, flags := p.WatchBody(request(t, openai.KindChat, tc.req, "req-1"), []byte(body))
			if flags != nil || string(rep) != tc.want {
				t.Fatalf("replacement %q flags %v, want %q", rep, flags, tc.want)
			}
			if rep != nil && !json.Valid(rep) {
				t.Fatalf("not JSON: %s", rep)
			}
			snap := p.Snapshot()
			if len(snap.Series) != 1 || snap.Series[0].Tokens != 2 {
				t.Fatalf("series %+v, want 2 tokens read", snap.Series)
			}
		})
	}
	// Not asked by anyone: nothing is read.
	p := newPolicy(t, Params{})
	if rep, _ := p.WatchBody(request(t, openai.KindChat, strings.Replace(chatReq, `"stream":true`, `"stream":false`, 1), "r"), []byte(body)); rep != nil || len(p.Snapshot().Series) != 0 {
		t.Fatal("an answer nobody asked logprobs for was read")
	}
}
