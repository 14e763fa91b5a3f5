package shadow

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

func TestRedact(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		want      []string // substrings that must remain
		gone      []string // substrings that must be gone
		nilResult bool
	}{
		{name: "identity fields dropped",
			in:   `{"model":"m","user":"alice@example.com","metadata":{"team":"x"},"safety_identifier":"u1","prompt_cache_key":"k","messages":[{"role":"user","content":"hi","name":"alice"}],"temperature":0.2,"max_tokens":64,"stream":true}`,
			want: []string{`"model":"m"`, `"content":"hi"`, `"temperature":0.2`, `"max_tokens":64`, `"stream":true`},
			gone: []string{"alice", "metadata", "safety_identifier", "prompt_cache_key", `"user":"`}},
		{name: "credential keys at any depth",
			in:   `{"model":"m","api_key":"k1","messages":[{"role":"user","content":"x","auth_token":"t","extra":{"password":"p","Authorization":"Bearer q","client-secret":"s","access_token":"a"}}],"stream_options":{"include_usage":true}}`,
			want: []string{`"include_usage":true`, `"extra":{}`},
			gone: []string{"api_key", "k1", "auth_token", "password", "Authorization", "client-secret", "access_token"}},
		{name: "schemas keep property names",
			in:   `{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"login","parameters":{"type":"object","properties":{"password":{"type":"string"},"token":{"type":"string"}}}}}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"properties":{"secret":{"type":"string"}}}}}}`,
			want: []string{`"password":{"type":"string"}`, `"token":{"type":"string"}`, `"secret":{"type":"string"}`}},
		{name: "tool message keeps its name",
			in:   `{"messages":[{"role":"tool","name":"get_weather","tool_call_id":"c1","content":"sunny"}]}`,
			want: []string{`"name":"get_weather"`}},
		{name: "secrets in text masked",
			in:   `{"messages":[{"role":"user","content":"my key is sk-proj-abcdefghijklmnop1234 and Bearer abcdefghijklmnopqrstuvwxyz0123"}]}`,
			want: []string{"my key is [redacted]", "and [redacted]"},
			gone: []string{"sk-proj", "abcdefghijklmnopqrstuvwxyz0123"}},
		{name: "numbers kept exactly", in: `{"seed":12345678901234567890,"top_p":0.1}`,
			want: []string{`"seed":12345678901234567890`, `"top_p":0.1`}},
		{name: "responses request",
			in:   `{"model":"m","instructions":"Be brief.","input":[{"role":"user","content":"hi"}],"max_output_tokens":32,"text":{"format":{"type":"json_schema","name":"x","schema":{"properties":{"password":{"type":"string"}}}}},"reasoning":{"effort":"low"},"previous_response_id":"resp_1","store":true,"user":"bob"}`,
			want: []string{`"instructions":"Be brief."`, `"max_output_tokens":32`, `"password":{"type":"string"}`, `"reasoning":{"effort":"low"}`},
			gone: []string{"previous_response_id", "resp_1", "bob", `"store"`}},
		{name: "not JSON", in: `hello`, nilResult: true},
		{name: "array", in: `[1,2]`, nilResult: true},
		{name: "null", in: `null`, nilResult: true},
		{name: "html not escaped", in: `{"prompt":"<b>&</b>"}`, want: []string{`"prompt":"<b>&</b>"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Redact([]byte(tt.in))
			if tt.nilResult {
				if got != nil {
					t.Fatalf("got %s, want nil", got)
				}
				return
			}
			if !json.Valid(got) {
				t.Fatalf("not JSON: %s", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(got), w) {
					t.Errorf("lacks %s: %s", w, got)
				}
			}
			for _, g := range tt.gone {
				if strings.Contains(string(got), g) {
					t.Errorf("still has %s: %s", g, got)
				}
			}
			if again := Redact(got); !bytes.Equal(again, got) {
				t.Errorf("not idempotent:\n%s\n%s", got, again)
			}
		})
	}
}

func TestRedactBounds(t *testing.T) {
	big := strings.Repeat("word ", MaxRedactedBytes/2)
	tests := []struct {
		name string
		body string
		want string
	}{
		{"long message cut", `{"messages":[{"role":"user","content":"` + big + `"},{"role":"user","content":"short"}]}`, "…[cut "},
		{"huge array stubbed", `{"stop":[` + strings.TrimSuffix(strings.Repeat(`"abcdefghij",`, MaxRedactedBytes/8), ",") + `]}`, "request too large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Redact([]byte(tt.body))
			if len(got) > MaxRedactedBytes || !json.Valid(got) || !strings.Contains(string(got), tt.want) {
				t.Fatalf("len %d valid %v: %.200s", len(got), json.Valid(got), got)
			}
		})
	}
}

func TestExportJSONL(t *testing.T) {
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 123e6, time.UTC)
	pairs := []PairRecord{testPair("chat", 0, t0, false), testPair("chat", 1, t0.Add(time.Second), true)}
	pairs[1].Candidate.ToolCalls = []ToolCall{{Name: "f", Arguments: `{"a":1}`}}
	pairs[0].Request = json.RawMessage(`{"user":"bob","messages":[{"role":"user","content":"q"}]}`) // bypassed NewPairRecord
	var b bytes.Buffer
	if err := ExportJSONL(context.Background(), &b, pairs); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&b)
	var lines []map[string]json.RawMessage
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), `{"route":`) {
			t.Errorf("line does not start with route: %.60s", sc.Text())
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("%d lines", len(lines))
	}
	if string(lines[0]["ts"]) != `"2025-01-02T03:04:05.123Z"` || strings.Contains(string(lines[0]["request"]), "bob") {
		t.Errorf("line 0: ts %s request %s", lines[0]["ts"], lines[0]["request"])
	}
	var cand ExportAnswer
	if err := json.Unmarshal(lines[1]["candidate"], &cand); err != nil {
		t.Fatal(err)
	}
	if cand.Status != 200 || cand.TTFTms != 44 || cand.Text != "the answer is 42" || len(cand.ToolCalls) != 1 || len(cand.Problems) == 0 {
		t.Errorf("candidate %+v", cand)
	}
	if _, ok := lines[0]["replica"]; !ok {
		t.Error("line 0 lacks its replica")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ExportJSONL(ctx, &b, pairs); err == nil {
		t.Error("cancelled export succeeded")
	}
	SortOldestFirst(pairs)
	if !pairs[0].Time.Equal(t0) {
		t.Error("SortOldestFirst")
	}
}

// goldenPairs are the pairs of testdata/export.jsonl, which test/load replays (a copy is
// test/load/testdata/shadow_pairs.jsonl): chat streaming and not, text completions, an
// embeddings request and a pair without a body (both skipped by a replay), tools; the
// lines are not in time order.
func goldenPairs() []PairRecord {
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	ok := func(text string, ttft time.Duration) Answer {
		return Answer{Status: 200, TTFT: ttft, ITL: 5 * time.Millisecond, E2E: ttft + 40*time.Millisecond, OutputTokens: 8,
			FinishReason: "stop", Text: text}
	}
	mk := func(route string, at time.Duration, endpoint, body string, p, c Answer) PairRecord {
		r := NewPairRecord(route, t0.Add(at), []byte(body), p, c, nil, Compare(Request{}, p, c))
		r.Endpoint, r.RequestID, r.Session = endpoint, fmt.Sprintf("req-%d", at/time.Millisecond), "9f2c"
		return r
	}
	tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	pairs := []PairRecord{
		mk("chat", 40*time.Millisecond, "/v1/chat/completions",
			`{"model":"llama-3-70b","user":"dave@example.com","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is a sluice?","name":"dave"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true},"temperature":0.7}`,
			ok("A gate that controls water flow.", 30*time.Millisecond), ok("A channel gate for water.", 45*time.Millisecond)),
		mk("chat", 0, "/v1/chat/completions",
			`{"model":"llama-3-70b","metadata":{"customer":"acme"},"messages":[{"role":"user","content":"Say hi"}],"max_tokens":4,"stream":false}`,
			ok("Hi!", 20*time.Millisecond), ok("Hello!", 25*time.Millisecond)),
		mk("complete", 20*time.Millisecond, "/v1/completions",
			`{"model":"llama-3-70b","prompt":"Once upon a time","max_tokens":6,"stream":true,"api_key":"sk-live-0123456789abcdefghij"}`,
			ok(" there was a gate", 15*time.Millisecond), Answer{Status: 503, ErrorClass: "upstream_5xx"}),
		mk("embed", 60*time.Millisecond, "/v1/embeddings", `{"model":"e5","input":"hello"}`, Answer{Status: 200}, Answer{Status: 200}),
		mk("chat", 80*time.Millisecond, "/v1/chat/completions", `not json`, ok("x", time.Millisecond), ok("y", time.Millisecond)),
		mk("tools", 100*time.Millisecond, "/v1/chat/completions",
			`{"model":"llama-3-70b","messages":[{"role":"user","content":"Weather in Oslo?"}],"tools":`+tools+`,"tool_choice":"auto","max_completion_tokens":16,"stream":true}`,
			Answer{Status: 200, TTFT: 30 * time.Millisecond, E2E: 60 * time.Millisecond, OutputTokens: 9, FinishReason: "tool_calls",
				ToolCalls: []ToolCall{{Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
			Answer{Status: 200, TTFT: 35 * time.Millisecond, E2E: 70 * time.Millisecond, OutputTokens: 7, FinishReason: "stop", Text: "It is sunny."}),
	}
	return pairs
}

// TestExportGolden pins the line format: SHADOW_UPDATE_GOLDEN=1 rewrites the file.
func TestExportGolden(t *testing.T) {
	var b bytes.Buffer
	if err := ExportJSONL(context.Background(), &b, goldenPairs()); err != nil {
		t.Fatal(err)
	}
	const path = "testdata/export.jsonl"
	if os.Getenv("SHADOW_UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Fatalf("export differs from %s (SHADOW_UPDATE_GOLDEN=1 to accept):\n%s", path, b.String())
	}
	for _, gone := range []string{"dave", "acme", "sk-live", "api_key"} {
		if bytes.Contains(want, []byte(gone)) {
			t.Errorf("%s leaks %q", path, gone)
		}
	}
}

// TestExportTriple: a triple's line carries the baseline's answer with its problems, the
// noise-floor similarity and the loads; a pair's line none of them.
func TestExportTriple(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	tri := testTriple("chat", 0, t0, true)
	bad := tri
	bb := Answer{Status: 200, Text: "not json", FinishReason: "stop"}
	bad.SetBaseline(bb)
	bad.Result = defaultCache.CompareTriple(Request{ResponseFormat: FormatJSONObject}, bad.Primary, bad.Baseline, bad.Candidate)
	bad.Result.Loads = Loads{Primary: 4, Baseline: 1.5, Candidate: 1, Valid: true}
	pair := testPair("chat", 1, t0.Add(time.Second), false)
	pair.Result.Loads = Loads{Primary: 3, Candidate: 7, Valid: true}
	unmeasured := testTriple("chat", 4, t0.Add(2*time.Second), false) // i%5 == 4: no loads
	failed := testTriple("chat", 2, t0.Add(3*time.Second), false)     // i%3 == 2: the baseline failed
	var b bytes.Buffer
	if err := ExportJSONL(context.Background(), &b, []PairRecord{tri, bad, pair, unmeasured, failed}); err != nil {
		t.Fatal(err)
	}
	var lines []ExportLine
	var raw []string
	sc := bufio.NewScanner(&b)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l ExportLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines, raw = append(lines, l), append(raw, sc.Text())
	}
	if len(lines) != 5 {
		t.Fatalf("%d lines", len(lines))
	}
	l := lines[0]
	if l.Baseline == nil || l.Baseline.Text != tri.Baseline.Text || l.Baseline.TTFTms != durMS(tri.Baseline.TTFT) || l.Baseline.Problems != nil {
		t.Errorf("baseline %+v", l.Baseline)
	}
	if l.NoiseSimilarity == nil || *l.NoiseSimilarity != tri.Result.NoiseSimilarity || *l.NoiseSimilarity <= 0 {
		t.Errorf("noise similarity %v, want %v", l.NoiseSimilarity, tri.Result.NoiseSimilarity)
	}
	if l.Loads == nil || l.Loads.Primary != 1 || l.Loads.Baseline == nil || *l.Loads.Baseline != 2 || l.Loads.Candidate != 2.5 {
		t.Errorf("loads %+v", l.Loads)
	}
	if !strings.Contains(raw[0], `"primary":{`) || strings.Index(raw[0], `"baseline":{`) > strings.Index(raw[0], `"candidate":{`) {
		t.Errorf("line order: %s", raw[0])
	}
	if bl := lines[1].Baseline; bl == nil || len(bl.Problems) == 0 || !strings.Contains(bl.Problems[0], "not JSON") {
		t.Errorf("the baseline's problems are not exported: %+v", bl)
	}
	if lines[1].NoiseSimilarity == nil { // answered whole: a sample, however low
		t.Errorf("noise similarity of an OK baseline not exported")
	}
	if p := lines[2]; p.Baseline != nil || p.NoiseSimilarity != nil || p.Loads == nil || p.Loads.Baseline != nil || p.Loads.Candidate != 7 {
		t.Errorf("pair line: baseline %v noise %v loads %+v", p.Baseline, p.NoiseSimilarity, p.Loads)
	}
	if strings.Contains(raw[2], `"baseline"`) || strings.Contains(raw[2], "noise_similarity") {
		t.Errorf("pair line has triple fields: %s", raw[2])
	}
	if lines[3].Loads != nil || strings.Contains(raw[3], `"loads"`) {
		t.Errorf("unmeasured loads exported: %s", raw[3])
	}
	if f := lines[4]; f.Baseline == nil || f.Baseline.Status != 503 || f.Baseline.ErrorClass != "upstream_5xx" || f.NoiseSimilarity != nil {
		t.Errorf("failed baseline: %+v, noise %v", f.Baseline, f.NoiseSimilarity)
	}
}
