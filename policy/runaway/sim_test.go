package runaway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/test/sim"
)

// TestSimulatedLoops: the simulator's looping answers (x-sim-loop-after) are cut within the
// bound of the loop's start, chat and Responses alike; its ordinary answers are not.
func TestSimulatedLoops(t *testing.T) {
	s := sim.New(sim.Config{})
	ts := httptest.NewServer(s)
	defer func() { ts.Close(); s.Close() }()

	th := defaults()
	for _, tc := range []struct {
		kind          openai.Kind
		after, period int // 0: no loop
		lead          int // events before the first token
	}{
		{openai.KindChat, 40, 12, 1},
		{openai.KindChat, 40, 1, 1},
		{openai.KindChat, 100, 64, 1},
		{openai.KindChat, 0, 0, 1},
		{openai.KindResponses, 40, 12, 4},
		{openai.KindResponses, 0, 0, 4},
	} {
		name := tc.kind.String() + "/" + strconv.Itoa(tc.after) + "/" + strconv.Itoa(tc.period)
		t.Run(name, func(t *testing.T) {
			body := map[string]any{"model": "sim-llama", "stream": true, "max_tokens": 1500}
			path := "/v1/chat/completions"
			if tc.kind == openai.KindResponses {
				path = "/v1/responses"
				body = map[string]any{"model": "sim-llama", "stream": true, "max_output_tokens": 1500, "input": "tell me about rivers"}
			} else {
				body["messages"] = []map[string]any{{"role": "user", "content": "tell me about rivers"}}
			}
			raw, _ := json.Marshal(body)
			req, err := http.NewRequest(http.MethodPost, ts.URL+path, bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			if tc.after > 0 {
				req.Header.Set(sim.HeaderLoopAfter, strconv.Itoa(tc.after))
				req.Header.Set(sim.HeaderLoopPeriod, strconv.Itoa(tc.period))
			}
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			parsed, err := openai.ParseRequest(tc.kind, raw)
			if err != nil {
				t.Fatal(err)
			}
			p := newPolicy(t, Params{})
			w := p.WatchStream(&policy.Request{Request: parsed, ID: "sim-1", Tenant: "acme"})
			defer w.End()
			r := openai.NewReader(resp.Body, 0)
			for n := 0; n < 5000; n++ {
				ev, err := r.Next()
				if err != nil {
					if tc.after > 0 {
						t.Fatalf("the stream ended after %d events, not cut", n)
					}
					return
				}
				a := w.Event(policy.StreamEvent{Raw: ev.Raw, Name: ev.Name, Data: ev.Data})
				if a.Cut == nil {
					continue
				}
				if tc.after == 0 {
					t.Fatalf("an ordinary answer cut at event %d: %s", n, a.Cut.Reason)
				}
				// One token an event: the loop starts at event lead + after; the words weigh 4,
				// so the bound is max((repeats-1)·period, min_words) + 4 tokens.
				start := tc.lead + tc.after
				bound := max((th.Repeats-1)*tc.period, th.MinWords) + 4
				if n < start || n > start+bound {
					t.Fatalf("cut at event %d, the loop starts at %d, bound %d", n, start, bound)
				}
				checkTail(t, a.Cut.Tail)
				return
			}
			t.Fatal("too many events")
		})
	}
}
