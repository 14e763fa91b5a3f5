package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start serves a simulator on 127.0.0.1 (ephemeral port); both are closed when the test ends.
func start(t testing.TB, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s := New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return s, ts
}

// post sends a JSON body (a string, []byte or anything json.Marshal takes) and returns the
// response with its body read.
func post(t testing.TB, ts *httptest.Server, path string, body any, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	resp, err := send(context.Background(), ts, path, body, hdr)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading body: %v", path, err)
	}
	return resp, b
}

func send(ctx context.Context, ts *httptest.Server, path string, body any, hdr map[string]string) (*http.Response, error) {
	var raw []byte
	switch b := body.(type) {
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return ts.Client().Do(req)
}

func get(t testing.TB, ts *httptest.Server, path string) (*http.Response, []byte) {
	t.Helper()
	resp, err := ts.Client().Get(ts.URL + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp, b
}

type sseEvent struct {
	data string
	at   time.Time
}

// readSSE reads data events until EOF or an error (returned with the events read so far).
func readSSE(r io.Reader) ([]sseEvent, error) {
	br := bufio.NewReader(r)
	var evs []sseEvent
	for {
		line, err := br.ReadString('\n')
		if rest, ok := strings.CutPrefix(line, "data: "); ok && strings.HasSuffix(line, "\n") {
			evs = append(evs, sseEvent{data: strings.TrimSuffix(rest, "\n"), at: time.Now()})
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return evs, nil
			}
			return evs, err
		}
	}
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type wireToolCall struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string  `json:"name"`
		Arguments *string `json:"arguments"`
	} `json:"function"`
}

type completionBody struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message *struct {
			Role      string         `json:"role"`
			Content   *string        `json:"content"`
			ToolCalls []wireToolCall `json:"tool_calls"`
		} `json:"message"`
		Delta *struct {
			Role      *string        `json:"role"`
			Content   *string        `json:"content"`
			ToolCalls []wireToolCall `json:"tool_calls"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

type errorBody struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

// answer is what a client assembles from a response, streamed or not.
type answer struct {
	text     []string // per choice index
	finish   []string
	toolID   string
	toolName string
	toolArgs string
	usage    *usage
	events   int
}

func (a *answer) grow(i int) {
	for len(a.text) <= i {
		a.text = append(a.text, "")
		a.finish = append(a.finish, "")
	}
}

func parseAnswer(t testing.TB, b []byte) answer {
	t.Helper()
	body := decode[completionBody](t, b)
	var a answer
	for _, c := range body.Choices {
		a.grow(c.Index)
		if c.FinishReason != nil {
			a.finish[c.Index] = *c.FinishReason
		}
		switch {
		case c.Message != nil:
			if c.Message.Content != nil {
				a.text[c.Index] = *c.Message.Content
			}
			for _, tc := range c.Message.ToolCalls {
				a.toolID, a.toolName = tc.ID, tc.Function.Name
				if tc.Function.Arguments != nil {
					a.toolArgs = *tc.Function.Arguments
				}
			}
		case c.Text != nil:
			a.text[c.Index] = *c.Text
		}
	}
	a.usage = body.Usage
	return a
}

// parseStream assembles a streamed answer and checks the stream's framing.
func parseStream(t testing.TB, evs []sseEvent, chat bool) answer {
	t.Helper()
	if len(evs) == 0 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %d events", len(evs))
	}
	var a answer
	a.events = len(evs)
	sawRole := map[int]bool{}
	var id string
	for n, ev := range evs[:len(evs)-1] {
		ch := decode[completionBody](t, []byte(ev.data))
		if id == "" {
			id = ch.ID
		} else if ch.ID != id {
			t.Errorf("chunk %d: id %q, want %q", n, ch.ID, id)
		}
		want := "text_completion"
		if chat {
			want = "chat.completion.chunk"
		}
		if ch.Object != want {
			t.Errorf("chunk %d: object %q, want %q", n, ch.Object, want)
		}
		if ch.Usage != nil {
			if len(ch.Choices) != 0 {
				t.Errorf("usage chunk has choices")
			}
			a.usage = ch.Usage
			continue
		}
		for _, c := range ch.Choices {
			a.grow(c.Index)
			if a.finish[c.Index] != "" {
				t.Errorf("chunk %d: choice %d continues after its finish chunk", n, c.Index)
			}
			if c.FinishReason != nil {
				a.finish[c.Index] = *c.FinishReason
			}
			if chat {
				if c.Delta == nil {
					t.Fatalf("chunk %d: no delta", n)
				}
				if !sawRole[c.Index] {
					if c.Delta.Role == nil || *c.Delta.Role != "assistant" {
						t.Errorf("chunk %d: first delta of choice %d has no role", n, c.Index)
					}
					sawRole[c.Index] = true
				}
				if c.Delta.Content != nil {
					a.text[c.Index] += *c.Delta.Content
				}
				for _, tc := range c.Delta.ToolCalls {
					if tc.ID != "" {
						a.toolID, a.toolName = tc.ID, tc.Function.Name
						if tc.Type != "function" || tc.Index == nil || tc.Function.Arguments == nil || *tc.Function.Arguments != "" {
							t.Errorf("chunk %d: first tool-call delta %+v", n, tc)
						}
					}
					if tc.Function.Arguments != nil {
						a.toolArgs += *tc.Function.Arguments
					}
				}
			} else if c.Text != nil {
				a.text[c.Index] += *c.Text
			}
		}
	}
	return a
}

func chatBody(content string, extra map[string]any) map[string]any {
	b := map[string]any{
		"model":    "sim-llama",
		"messages": []map[string]any{{"role": "user", "content": content}},
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// chat runs a chat request streamed or not and returns the assembled answer.
func chat(t testing.TB, ts *httptest.Server, body map[string]any, stream bool) answer {
	t.Helper()
	b := map[string]any{}
	for k, v := range body {
		b[k] = v
	}
	return run(t, ts, "/v1/chat/completions", b, stream, true)
}

func run(t testing.TB, ts *httptest.Server, path string, b map[string]any, stream, isChat bool) answer {
	t.Helper()
	return runHeaders(t, ts, path, b, stream, isChat, nil)
}

// runHeaders is run with request headers (the knobs).
func runHeaders(t testing.TB, ts *httptest.Server, path string, b map[string]any, stream, isChat bool, hdr map[string]string) answer {
	t.Helper()
	b["stream"] = stream
	if stream {
		b["stream_options"] = map[string]any{"include_usage": true}
	}
	resp, err := send(context.Background(), ts, path, b, hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	if !stream {
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return parseAnswer(t, raw)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	evs, err := readSSE(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return parseStream(t, evs, isChat)
}

// waitFor polls cond every few milliseconds for at most d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
