package runaway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// Streams as vLLM writes them: one piece of text (about a token) an event.

const (
	streamID      = "chatcmpl-3f2a1b0c9d8e7f6a"
	streamModel   = "meta-llama/Llama-3.1-8B-Instruct"
	streamCreated = 1718041200
)

// pieces cuts text as a model server's detokenizer does: before each space, and after at
// most 6 characters, never inside a character.
func pieces(text string) []string {
	var out []string
	start, runes := 0, 0
	for i, r := range text {
		if i > start && (r == ' ' || r == '\n' || runes == 6) {
			out = append(out, text[start:i])
			start, runes = i, 0
		}
		runes++
	}
	if start < len(text) {
		out = append(out, text[start:])
	}
	return out
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func chatChunk(choice int, delta, finish string) string {
	f := "null"
	if finish != "" {
		f = jsonString(finish)
	}
	return fmt.Sprintf(`data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":"%s","choices":[{"index":%d,"delta":%s,"logprobs":null,"finish_reason":%s}]}`+"\n\n",
		streamID, streamCreated, streamModel, choice, delta, f)
}

// chatStream is a chat stream of n choices, each answering text (choice i's text is text
// for every choice), interleaved piece by piece.
func chatStream(text string, n int) string {
	texts := make([]string, n)
	for i := range texts {
		texts[i] = text
	}
	return chatStreamOf(texts...)
}

// chatStreamOf is a chat stream whose choice i answers texts[i], interleaved piece by piece;
// each choice finishes ("stop") when its text ends.
func chatStreamOf(texts ...string) string {
	var b strings.Builder
	ps := make([][]string, len(texts))
	for i, t := range texts {
		b.WriteString(chatChunk(i, `{"role":"assistant","content":""}`, ""))
		ps[i] = pieces(t)
	}
	for j := 0; ; j++ {
		more := false
		for i := range ps {
			switch {
			case j < len(ps[i]):
				b.WriteString(chatChunk(i, `{"content":`+jsonString(ps[i][j])+`}`, ""))
				more = true
			case j == len(ps[i]):
				b.WriteString(chatChunk(i, `{}`, "stop"))
				more = true
			}
		}
		if !more {
			break
		}
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// toolStream is a chat stream of one tool call whose arguments are args.
func toolStream(args string) string {
	var b strings.Builder
	b.WriteString(chatChunk(0, `{"role":"assistant","content":""}`, ""))
	b.WriteString(chatChunk(0, `{"tool_calls":[{"id":"chatcmpl-tool-0f1e2d3c","type":"function","index":0,"function":{"name":"create_events"}}]}`, ""))
	for _, p := range pieces(args) {
		b.WriteString(chatChunk(0, `{"tool_calls":[{"index":0,"function":{"arguments":`+jsonString(p)+`}}]}`, ""))
	}
	b.WriteString(chatChunk(0, `{"content":""}`, "tool_calls"))
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

func completionStream(text string) string {
	var b strings.Builder
	chunk := func(t, finish string) {
		f := "null"
		if finish != "" {
			f = jsonString(finish)
		}
		fmt.Fprintf(&b, `data: {"id":"cmpl-7b","object":"text_completion","created":%d,"model":"%s","choices":[{"index":0,"text":%s,"logprobs":null,"finish_reason":%s,"stop_reason":null}],"usage":null}`+"\n\n",
			streamCreated, streamModel, jsonString(t), f)
	}
	for _, p := range pieces(text) {
		chunk(p, "")
	}
	chunk("", "stop")
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// responsesStream is a Responses API stream answering text, its members in alphabetical order
// as vLLM writes them.
func responsesStream(text string) string {
	var b strings.Builder
	seq := 0
	ev := func(typ, body string) {
		fmt.Fprintf(&b, "event: %s\ndata: {%s\"sequence_number\":%d,\"type\":\"%s\"}\n\n", typ, body, seq, typ)
		seq++
	}
	resp := func(status string) string {
		return fmt.Sprintf(`"response":{"created_at":%d,"id":"resp_6b1e0c7d","model":"%s","object":"response","output":[],"status":"%s","usage":null},`, streamCreated, streamModel, status)
	}
	ev("response.created", resp("in_progress"))
	ev("response.in_progress", resp("in_progress"))
	ev("response.output_item.added", `"item":{"content":[],"id":"msg_0f9e","role":"assistant","status":"in_progress","type":"message"},"output_index":0,`)
	ev("response.content_part.added", `"content_index":0,"item_id":"msg_0f9e","output_index":0,"part":{"annotations":[],"text":"","type":"output_text"},`)
	for _, p := range pieces(text) {
		ev("response.output_text.delta", `"content_index":0,"delta":`+jsonString(p)+`,"item_id":"msg_0f9e","logprobs":[],"output_index":0,`)
	}
	ev("response.output_text.done", `"content_index":0,"item_id":"msg_0f9e","output_index":0,"text":`+jsonString(text)+`,`)
	ev("response.completed", resp("completed"))
	return b.String()
}

// streamRequest is a streamed request of kind k for tenant with n choices.
func streamRequest(t testing.TB, k openai.Kind, tenant string, n int) *policy.Request {
	t.Helper()
	var body string
	switch k {
	case openai.KindCompletion:
		body = fmt.Sprintf(`{"model":"llama","prompt":"Once upon a time","stream":true,"n":%d,"max_tokens":4096}`, n)
	case openai.KindResponses:
		body = `{"model":"llama","input":"Tell me a story.","stream":true,"max_output_tokens":4096}`
	default:
		body = fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"Tell me a story."}],"stream":true,"n":%d,"max_tokens":4096}`, n)
	}
	r, err := openai.ParseRequest(k, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return &policy.Request{Request: r, ID: "req-1", Route: "r", Tenant: tenant}
}

// run streams stream through w, event by event, until it ends or w cuts it: the events
// relayed (cut: the ones before the cut) and the cut.
func run(t testing.TB, w policy.StreamWatcher, stream string) (relayed int, cut *policy.StreamCut) {
	t.Helper()
	r := openai.NewReader(strings.NewReader(stream), 0)
	for {
		ev, err := r.Next()
		if err != nil {
			return relayed, nil
		}
		a := w.Event(policy.StreamEvent{Raw: ev.Raw, Name: ev.Name, Data: ev.Data})
		if a.Cut != nil {
			return relayed, a.Cut
		}
		relayed++
	}
}

func newPolicy(t testing.TB, p Params) *Policy {
	t.Helper()
	pol, err := New(p, policy.Env{Route: "r", Name: policy.TypedName{Type: "runaway", Name: "runaway"}})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}
