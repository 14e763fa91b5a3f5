package fault

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

// contentOf returns a chunk's choices[0].delta.content ("" if none).
func contentOf(t testing.TB, data string) (string, bool) {
	t.Helper()
	var c struct {
		Choices []struct {
			Delta struct {
				Content *string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Choices) == 0 || c.Choices[0].Delta.Content == nil {
		return "", false
	}
	return *c.Choices[0].Delta.Content, true
}

func TestStreamFaultsBothSides(t *testing.T) {
	chat := readFile(t, "chat.sse")
	tools := readFile(t, "tool_calls.sse")
	ev := events(t, chat) // [0] is the keep-alive comment, [1..10] data, [11] [DONE]
	if len(ev) != 12 || !strings.HasPrefix(ev[0], ":") || ev[11] != "data: [DONE]\n\n" {
		t.Fatalf("testdata: %d events", len(ev))
	}
	usageEvent := ev[10]
	sseErr := string(openai.NewError(502, "server_error", "fault_injected", "injected fault: stream cut").SSE())

	tests := []struct {
		name   string
		header string
		in     string
		want   string                           // exact output, when set
		check  func(t *testing.T, out string)   // else this
		sleeps []time.Duration                  // waits asked for
		upErr  func(t *testing.T, err error)    // upstream read error (nil: none)
		downOK func(t *testing.T, panicked any) // downstream panic (nil: none)
	}{
		{name: "no fault of this side passes bytes exactly", header: "drop(done,side=OTHER)", in: chat, want: chat},
		{name: "cut eof after 3", header: "cut(after=3,mode=eof)", in: chat, want: strings.Join(ev[:4], "")},
		{name: "cut default mode is eof, after 0 is before the first event", header: "cut", in: chat, want: ev[0]},
		{name: "cut sse_error after 2", header: "cut(after=2,sse_error)", in: chat, want: strings.Join(ev[:3], "") + sseErr},
		{name: "cut after the last event never fires", header: "cut(after=11)", in: chat, want: chat},
		{name: "drop usage removes exactly the usage chunk", header: "drop(usage)", in: chat,
			want: strings.Replace(chat, usageEvent, "", 1)},
		{name: "drop done", header: "drop(mode=done)", in: chat, want: strings.Replace(chat, "data: [DONE]\n\n", "", 1)},
		{name: "drop usage on a chunk with choices drops only the field", header: "drop", in: tools,
			want: strings.Replace(tools, `,"usage":{"prompt_tokens":30,"total_tokens":45,"completion_tokens":15}`, "", 1)},
		{name: "malformed at 2 truncates", header: "malformed(at=2)", in: chat, check: func(t *testing.T, out string) {
			got, want := dataEvents(t, out), dataEvents(t, chat)
			if len(got) != len(want) {
				t.Fatalf("%d events, want %d", len(got), len(want))
			}
			for i := range got {
				if i == 1 {
					if json.Valid([]byte(got[i])) || !strings.HasPrefix(want[i], got[i]) || len(got[i]) != len(want[i])/2 {
						t.Errorf("event 2 %q is not the truncated %q", got[i], want[i])
					}
				} else if got[i] != want[i] {
					t.Errorf("event %d changed: %q", i+1, got[i])
				}
			}
		}},
		{name: "malformed invalid", header: "malformed(at=3,mode=invalid)", in: chat, check: func(t *testing.T, out string) {
			got, want := dataEvents(t, out), dataEvents(t, chat)
			if json.Valid([]byte(got[2])) || got[2] != want[2][:len(want[2])-1]+",}" {
				t.Errorf("event 3 %q", got[2])
			}
			got[2] = want[2]
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Error("other events changed")
			}
		}},
		{name: "corrupt at rate 1 changes every content token, JSON stays valid", header: "corrupt(rate=1,seed=7)", in: chat,
			check: func(t *testing.T, out string) {
				got, want := dataEvents(t, out), dataEvents(t, chat)
				if len(got) != len(want) {
					t.Fatalf("%d events, want %d", len(got), len(want))
				}
				changed := 0
				for i := range got {
					if got[i] == "[DONE]" {
						continue
					}
					if !json.Valid([]byte(got[i])) {
						t.Fatalf("event %d invalid JSON: %s", i+1, got[i])
					}
					oc, _ := contentOf(t, want[i])
					nc, _ := contentOf(t, got[i])
					if strings.TrimSpace(oc) == "" {
						if got[i] != want[i] {
							t.Errorf("event %d without content changed", i+1)
						}
						continue
					}
					if nc == oc || strings.HasPrefix(oc, " ") != strings.HasPrefix(nc, " ") {
						t.Errorf("event %d: %q → %q", i+1, oc, nc)
					}
					changed++
					ob, _ := json.Marshal(oc)
					nb, _ := json.Marshal(nc)
					if strings.Replace(got[i], string(nb), string(ob), 1) != want[i] {
						t.Errorf("event %d changed beyond its content: %s", i+1, got[i])
					}
				}
				if changed != 7 {
					t.Errorf("%d content events changed, want 7", changed)
				}
			}},
		{name: "drift renames tool call arguments", header: "drift(rename=choices[].delta.tool_calls[].function.arguments:args)", in: tools,
			want: strings.ReplaceAll(tools, `"arguments":`, `"args":`)},
		{name: "drift removes usage", header: "drift(remove=usage)", in: chat, check: func(t *testing.T, out string) {
			want := strings.ReplaceAll(chat, `,"usage":null`, "")
			want = strings.Replace(want, `,"usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7}`, "", 1)
			if out != want {
				t.Errorf("got\n%s\nwant\n%s", out, want)
			}
		}},
		{name: "drift removes a first member and renames a nested one", header: "drift(remove=id,rename=choices[].finish_reason:stop)", in: tools,
			check: func(t *testing.T, out string) {
				want := strings.ReplaceAll(tools, `{"id":"chatcmpl-tc01",`, "{")
				want = strings.ReplaceAll(want, `"finish_reason":`, `"stop":`)
				if out != want {
					t.Errorf("got\n%s\nwant\n%s", out, want)
				}
			}},
		{name: "ttft holds the first event", header: "ttft(for=3s)", in: chat, want: chat, sleeps: []time.Duration{3 * time.Second}},
		{name: "stall after 4 events", header: "stall(after=4,for=2s)", in: chat, want: chat, sleeps: []time.Duration{2 * time.Second}},
		{name: "stall after 2 tokens", header: "stall(after_tokens=2,for=1s)", in: chat, want: chat, sleeps: []time.Duration{time.Second}},
		{name: "drip every event", header: "drip(gap=10ms)", in: chat, want: chat,
			sleeps: repeat(10*time.Millisecond, 11)},
		{name: "reset", header: "cut(after=3,mode=reset)", in: chat, want: strings.Join(ev[:4], ""),
			upErr: func(t *testing.T, err error) {
				if err == nil || errors.Is(err, io.EOF) || !errors.Is(err, syscall.ECONNRESET) || !errors.Is(err, ErrInjected) {
					t.Errorf("err %v", err)
				}
			},
			downOK: func(t *testing.T, p any) {
				if p != http.ErrAbortHandler {
					t.Errorf("panic %v, want http.ErrAbortHandler", p)
				}
			}},
		{name: "h2reset", header: "cut(after=1,h2reset)", in: chat, want: strings.Join(ev[:2], ""),
			upErr: func(t *testing.T, err error) {
				var ce *CutError
				if err == nil || errors.Is(err, io.EOF) || !errors.As(err, &ce) || !strings.Contains(err.Error(), "stream error") {
					t.Errorf("err %v", err)
				}
			},
			downOK: func(t *testing.T, p any) {
				if p != http.ErrAbortHandler {
					t.Errorf("panic %v, want http.ErrAbortHandler", p)
				}
			}},
	}
	for _, tc := range tests {
		for _, side := range []Side{Upstream, Downstream} {
			t.Run(tc.name+"/"+string(side), func(t *testing.T) {
				hs := strings.ReplaceAll(tc.header, "OTHER", string(map[Side]Side{Upstream: Downstream, Downstream: Upstream}[side]))
				sp := specs(t, hs)
				for i := range sp {
					if sp[i].Side == "" {
						sp[i].Side = side
					}
				}
				e, _, sl := newEngine(t, sp...)
				var out string
				if side == Upstream {
					var err error
					out, err = upstream(t, e, tc.in, true)
					switch {
					case tc.upErr != nil:
						tc.upErr(t, err)
					case err != nil:
						t.Fatalf("read: %v", err)
					}
				} else {
					var p any
					out, p = downstream(t, e, tc.in, "text/event-stream")
					switch {
					case tc.downOK != nil:
						tc.downOK(t, p)
					case p != nil:
						t.Fatalf("panic: %v", p)
					}
				}
				if tc.check != nil {
					tc.check(t, out)
				} else if out != tc.want {
					t.Errorf("got\n%s\nwant\n%s", out, tc.want)
				}
				if got := sl.all(); !equalDurations(got, tc.sleeps) {
					t.Errorf("sleeps %v, want %v", got, tc.sleeps)
				}
			})
		}
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCorruptIsDeterministicGivenASeed(t *testing.T) {
	chat := readFile(t, "chat.sse")
	run := func(h string) string {
		e, _, _ := newEngine(t, specs(t, h)...)
		out, err := upstream(t, e, chat, true)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	a, b := run("corrupt(rate=0.5,seed=42)"), run("corrupt(rate=0.5,seed=42)")
	if a != b {
		t.Fatal("same seed, different output")
	}
	if a == chat {
		t.Fatal("rate 0.5 changed nothing")
	}
	if c := run("corrupt(rate=0.5,seed=43)"); c == a {
		t.Error("another seed gave the same output")
	}
	// The default rate (0.002) leaves a short answer alone most of the time and keeps it valid.
	for _, d := range dataEvents(t, run("corrupt")) {
		if d != "[DONE]" && !json.Valid([]byte(d)) {
			t.Fatalf("invalid %s", d)
		}
	}
}

func TestCorrupterVocabulary(t *testing.T) {
	e, _, _ := newEngine(t)
	c := &corrupter{rate: 1, rng: e.newInjection(nil, "", "").rng(0)}
	for _, in := range []string{"Paris", "THE", "42", ",", "Monday", "don't", "Übermut", "x"} {
		o, ch := c.text([]byte(in))
		out := string(o)
		if !ch || out == in {
			t.Errorf("%q unchanged", in)
		}
		if in == "42" && (len(out) != 2 || !isDigits(out)) {
			t.Errorf("42 → %q", out)
		}
		if in == "Paris" && !strings.Contains("London Berlin Madrid Rome Tokyo Lisbon Vienna Lyon", out) {
			t.Errorf("Paris → %q, want another city", out)
		}
		if in == "THE" && strings.ToUpper(out) != out {
			t.Errorf("THE → %q, want upper case", out)
		}
	}
	if out, ch := (&corrupter{rate: 1, rng: c.rng}).text([]byte("  \n")); ch || string(out) != "  \n" {
		t.Errorf("space changed: %q", out)
	}
}

func TestNonStreamingBody(t *testing.T) {
	body := readFile(t, "chat.json")
	tests := []struct {
		header string
		check  func(t *testing.T, out string)
	}{
		{"drift(remove=usage)", func(t *testing.T, out string) {
			want := strings.Replace(body, `,"usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7}`, "", 1)
			if out != want {
				t.Errorf("got %s", out)
			}
		}},
		{"drift(rename=choices[].message.content:text)", func(t *testing.T, out string) {
			if out != strings.Replace(body, `"content":`, `"text":`, 1) {
				t.Errorf("got %s", out)
			}
		}},
		{"corrupt(rate=1,seed=1)", func(t *testing.T, out string) {
			var r struct {
				Choices []struct {
					Message struct{ Content string } `json:"message"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			got := strings.Fields(r.Choices[0].Message.Content)
			want := strings.Fields("The capital of France is Paris.")
			if len(got) != len(want) {
				t.Fatalf("%q", r.Choices[0].Message.Content)
			}
			for i := range got {
				if got[i] == want[i] {
					t.Errorf("word %d %q unchanged", i, got[i])
				}
			}
		}},
		{"malformed", func(t *testing.T, out string) {
			if json.Valid([]byte(out)) || out != body[:len(body)/2] {
				t.Errorf("got %s", out)
			}
		}},
		{"cut(after=0); stall(for=1s); drop(usage)", func(t *testing.T, out string) {
			if out != body {
				t.Errorf("stream faults changed a JSON body: %s", out)
			}
		}},
	}
	for _, tc := range tests {
		for _, side := range []Side{Upstream, Downstream} {
			t.Run(tc.header+"/"+string(side), func(t *testing.T) {
				sp := specs(t, tc.header)
				for i := range sp {
					sp[i].Side = side
				}
				e, _, _ := newEngine(t, sp...)
				var out string
				if side == Upstream {
					var err error
					if out, err = upstream(t, e, body, false); err != nil {
						t.Fatal(err)
					}
				} else {
					var p any
					if out, p = downstream(t, e, body, "application/json"); p != nil {
						t.Fatal(p)
					}
				}
				tc.check(t, out)
			})
		}
	}
}

func TestDownstreamPassesErrorsAndKeepsFlusher(t *testing.T) {
	e, _, _ := newEngine(t, specs(t, "malformed(side=downstream)")...)
	in := e.Plan(request("r", "m"), "chat", nil)
	defer in.Done(Outcome{Status: 502})
	rec := httptest.NewRecorder()
	w := in.WrapDownstream(context.Background(), rec)
	if _, ok := w.(http.Flusher); !ok {
		t.Fatal("not a Flusher")
	}
	if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); !ok || u.Unwrap() != rec {
		t.Fatal("no Unwrap")
	}
	body := openai.NewError(502, "server_error", "x", "boom").Body()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(502)
	_, _ = w.Write(body)
	if err := http.NewResponseController(w).Flush(); err != nil || !rec.Flushed {
		t.Fatal("flush", err)
	}
	if rec.Body.String() != string(body) || rec.Code != 502 {
		t.Errorf("error answer changed: %d %s", rec.Code, rec.Body)
	}
}

func TestDownstreamEOFSwallowsLaterWrites(t *testing.T) {
	e, _, _ := newEngine(t, specs(t, "cut(after=1,side=downstream)")...)
	in := e.Plan(request("r", "m"), "chat", nil)
	defer in.Done(Outcome{Status: 200})
	rec := httptest.NewRecorder()
	w := in.WrapDownstream(context.Background(), rec)
	w.Header().Set("Content-Type", "text/event-stream")
	for i, ev := range []string{"data: {\"a\":1}\n\n", "data: {\"a\":2}\n\n", "data: [DONE]\n\n"} {
		n, err := w.Write([]byte(ev))
		if n != len(ev) || err != nil {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
	}
	if rec.Body.String() != "data: {\"a\":1}\n\n" {
		t.Errorf("client got %q", rec.Body)
	}
}

func TestDownstreamSeveralEventsInOneWrite(t *testing.T) {
	e, _, sl := newEngine(t, specs(t, "stall(after=1,for=1s,side=downstream); drop(done,side=downstream)")...)
	in := e.Plan(request("r", "m"), "chat", nil)
	defer in.Done(Outcome{Status: 200})
	rec := httptest.NewRecorder()
	w := in.WrapDownstream(context.Background(), rec)
	w.Header().Set("Content-Type", "text/event-stream")
	in1 := ": hi\r\n\r\ndata: 1\r\n\r\ndata: a\ndata: b\n\ndata: [DONE]\n\npartial"
	if _, err := w.Write([]byte(in1)); err != nil {
		t.Fatal(err)
	}
	if want := ": hi\r\n\r\ndata: 1\r\n\r\ndata: a\ndata: b\n\npartial"; rec.Body.String() != want {
		t.Errorf("got %q want %q", rec.Body, want)
	}
	if got := sl.all(); len(got) != 1 || got[0] != time.Second {
		t.Errorf("sleeps %v", got)
	}
}

func TestRealWaitsAndCancellation(t *testing.T) {
	chat := readFile(t, "chat.sse")
	e, err := New(Config{Enabled: true, Faults: specs(t, "ttft(for=30ms); drip(gap=2ms)")}, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := upstream(t, e, chat, true); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 30*time.Millisecond+11*2*time.Millisecond || d > 5*time.Second {
		t.Errorf("took %v", d)
	}

	// A stall of an hour ends with the context.
	if err := e.Set(specs(t, "stall(after=2,for=1h)")); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("ttft time-out")
	ctx, cancel := context.WithCancelCause(context.Background())
	in := e.Plan(request("r", "m"), "chat", nil)
	defer in.Done(Outcome{Status: 504})
	rc := in.Attempt("c").WrapUpstream(ctx, io.NopCloser(strings.NewReader(chat)), true)
	time.AfterFunc(20*time.Millisecond, func() { cancel(cause) })
	start = time.Now()
	b, err := io.ReadAll(rc)
	if !errors.Is(err, cause) || time.Since(start) > 5*time.Second {
		t.Fatalf("err %v after %v", err, time.Since(start))
	}
	if got := len(dataEvents(t, string(b))); got != 2 {
		t.Errorf("%d events before the stall, want 2", got)
	}

	// Downstream: the Write fails with the cause.
	if err := e.Set(specs(t, "ttft(for=1h,side=downstream)")); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	in2 := e.Plan(request("r", "m"), "chat", nil)
	defer in2.Done(Outcome{Status: 499})
	w := in2.WrapDownstream(ctx2, httptest.NewRecorder())
	w.Header().Set("Content-Type", "text/event-stream")
	time.AfterFunc(10*time.Millisecond, func() { cancel2(cause) })
	if _, err := w.Write([]byte("data: x\n\n")); !errors.Is(err, cause) {
		t.Fatalf("write: %v", err)
	}
}

// TestClearEndsWaitsInFlight: the kill switch ends a wait in progress at once, on both sides
// and before forwarding; the request then goes on unfaulted.
func TestClearEndsWaitsInFlight(t *testing.T) {
	chat := readFile(t, "chat.sse")
	e, err := New(Config{Enabled: true, Faults: specs(t, "stall(after=2,for=1h); stall(after=2,for=1h,side=downstream); delay(for=1h,side=downstream)")}, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	in := e.Plan(request("r", "m"), "chat", nil)
	defer in.Done(Outcome{Status: 200})
	pull := func() { time.AfterFunc(20*time.Millisecond, e.Clear) }

	pull()
	start := time.Now()
	if ab, err := in.Before(context.Background()); ab != nil || err != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("delay: abort %v, err %v after %v", ab, err, time.Since(start))
	}

	// Planned again after the Clear above (which also cleared the faults).
	if err := e.Set(specs(t, "stall(after=2,for=1h); stall(after=2,for=1h,side=downstream)")); err != nil {
		t.Fatal(err)
	}
	in2 := e.Plan(request("r2", "m"), "chat", nil)
	defer in2.Done(Outcome{Status: 200})
	rc := in2.Attempt("c").WrapUpstream(context.Background(), io.NopCloser(strings.NewReader(chat)), true)
	pull()
	start = time.Now()
	b, err := io.ReadAll(rc)
	if err != nil || string(b) != chat || time.Since(start) > 5*time.Second {
		t.Fatalf("upstream: err %v after %v, %d of %d bytes", err, time.Since(start), len(b), len(chat))
	}

	if err := e.Set(specs(t, "stall(after=1,for=1h,side=downstream)")); err != nil {
		t.Fatal(err)
	}
	in3 := e.Plan(request("r3", "m"), "chat", nil)
	defer in3.Done(Outcome{Status: 200})
	rec := httptest.NewRecorder()
	w := in3.WrapDownstream(context.Background(), rec)
	w.Header().Set("Content-Type", "text/event-stream")
	pull()
	start = time.Now()
	if _, err := w.Write([]byte("data: 1\n\ndata: 2\n\n")); err != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("downstream: err %v after %v", err, time.Since(start))
	}
	if rec.Body.String() != "data: 1\n\ndata: 2\n\n" {
		t.Errorf("client got %q", rec.Body)
	}
}

func TestGammaDelay(t *testing.T) {
	e, _, _ := newEngine(t)
	rng := e.newInjection(nil, "", "").rng(0)
	const n = 20000
	var sum float64
	for range n {
		sum += float64(wait(rng, 0, 0, 2.1, 120*time.Millisecond))
	}
	mean := time.Duration(sum / n)
	// Gamma(2.1, 120ms) has mean 252ms and sd ≈ 174ms: the sample mean is within ±5%.
	if mean < 240*time.Millisecond || mean > 265*time.Millisecond {
		t.Errorf("mean %v, want ≈ 252ms", mean)
	}
	if d := wait(rng, 0, 0, 0.5, time.Millisecond); d < 0 {
		t.Errorf("shape < 1: %v", d)
	}
}
