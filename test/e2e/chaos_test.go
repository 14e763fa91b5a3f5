package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicegw/sluice/test/sim"
)

// The chaos tests run the gateway with its admin token in chaosTokenEnv (t.Setenv: these
// tests are not parallel): admin calls send it as a bearer token, fault headers as
// x-sluice-admin-token.
const (
	chaosTokenEnv = "SLUICE_E2E_CHAOS_TOKEN"
	chaosToken    = "chaos-e2e-secret"
)

// chaosStreamBody is a deterministic streaming chat request with a usage chunk: the role
// chunk, 8 token chunks, the finish chunk, the usage chunk and [DONE] (12 events).
const chaosStreamBody = `{"model":"sim-llama","stream":true,"stream_options":{"include_usage":true},"max_tokens":8,` +
	`"ignore_eos":true,"temperature":0,"messages":[{"role":"user","content":"Tell me a story about a lighthouse."}]}`

// chaosJSONBody is the same request without streaming.
const chaosJSONBody = `{"model":"sim-llama","max_tokens":8,"ignore_eos":true,"temperature":0,` +
	`"messages":[{"role":"user","content":"Tell me a story about a lighthouse."}]}`

// startChaos starts a gateway with the given chaos section (YAML flow), routes and clusters
// (name, URL pairs), its admin token in chaosTokenEnv.
func startChaos(t *testing.T, chaos, routes string, clusters ...string) *gateway {
	t.Helper()
	t.Setenv(chaosTokenEnv, chaosToken)
	cfg := routingConfig(routes, clusters...)
	cfg = strings.Replace(cfg, "admin: {listen: 127.0.0.1:0}\n",
		"admin: {listen: 127.0.0.1:0, token_env: "+chaosTokenEnv+"}\nchaos: "+chaos+"\n", 1)
	return startGateway(t, cfg)
}

// oneSimChaos is a gateway with one route "all" to one simulator (cluster "main").
func oneSimChaos(t *testing.T, chaos string) (*gateway, *simServer) {
	t.Helper()
	s := startSim(t, sim.Config{})
	return startChaos(t, chaos, "  - name: all\n    cluster: main\n", "main", s.URL), s
}

// faultHeader is the x-sluice-fault header with the right admin token.
func faultHeader(spec string) []string {
	return []string{"x-sluice-fault", spec, "x-sluice-admin-token", chaosToken}
}

// adminCall calls the gateway's admin API with the bearer token.
func adminCall(t *testing.T, hc *http.Client, g *gateway, method, path, body string) (*http.Response, []byte) {
	t.Helper()
	return do(t, hc, method, "http://"+g.admin+path, body, "Authorization", "Bearer "+chaosToken)
}

// faultRecord is one entry of GET /admin/faults/log.
type faultRecord struct {
	RequestID  string `json:"request_id"`
	FaultID    string `json:"fault_id"`
	Kind       string `json:"kind"`
	Side       string `json:"side"`
	Verdict    string `json:"verdict"`
	Status     int    `json:"status"`
	ErrorClass string `json:"error_class"`
	Cluster    string `json:"cluster"`
	Attempts   int    `json:"attempts"`
	Fallback   bool   `json:"fallback"`
}

func faultLog(t *testing.T, hc *http.Client, g *gateway) []faultRecord {
	t.Helper()
	resp, b := adminCall(t, hc, g, http.MethodGet, "/admin/faults/log", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/admin/faults/log: %d %s", resp.StatusCode, b)
	}
	var out struct {
		Log []faultRecord `json:"log"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("/admin/faults/log: %v: %s", err, b)
	}
	return out.Log
}

// logFor waits for the log record of the request with the given id (Done runs as the
// handler returns, possibly just after the client has read the end of the answer).
func logFor(t *testing.T, hc *http.Client, g *gateway, id string) faultRecord {
	t.Helper()
	var rec faultRecord
	eventually(t, 5*time.Second, "a fault log record for request "+id, func() bool {
		for _, r := range faultLog(t, hc, g) {
			if r.RequestID == id {
				rec = r
				return true
			}
		}
		return false
	})
	return rec
}

// faultStatus is one fault of GET /admin/faults.
type faultStatus struct {
	ID      string          `json:"id"`
	Spec    json.RawMessage `json:"spec"`
	Planned uint64          `json:"planned"`
	Fired   uint64          `json:"fired"`
}

func listFaults(t *testing.T, hc *http.Client, g *gateway) []faultStatus {
	t.Helper()
	resp, b := adminCall(t, hc, g, http.MethodGet, "/admin/faults", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/faults: %d %s", resp.StatusCode, b)
	}
	var out struct {
		Enabled bool          `json:"enabled"`
		Faults  []faultStatus `json:"faults"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("GET /admin/faults: %v: %s", err, b)
	}
	if !out.Enabled {
		t.Errorf("GET /admin/faults: enabled false: %s", b)
	}
	return out.Faults
}

// timedEvent is one raw SSE event and when its last byte arrived.
type timedEvent struct {
	raw string
	sseEvent
	at time.Time
}

// sseRead sends a request and reads its SSE body event by event, timing each one. err is
// the read error that ended the body early (nil on a clean end).
func sseRead(t *testing.T, hc *http.Client, url, body string, hdr ...string) (resp *http.Response, evs []timedEvent, sent time.Time, err error) {
	t.Helper()
	resp, evs, sent, err = sseDo(hc, url, body, hdr...)
	if resp == nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp, evs, sent, err
}

// sseDo is sseRead for any goroutine: resp is nil when the request failed.
func sseDo(hc *http.Client, url, body string, hdr ...string) (resp *http.Response, evs []timedEvent, sent time.Time, err error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, nil, sent, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	sent = time.Now()
	resp, err = hc.Do(req)
	if err != nil {
		return nil, nil, sent, err
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var cur strings.Builder
	for {
		line, lerr := br.ReadString('\n')
		cur.WriteString(line)
		if line == "\n" || line == "\r\n" {
			raw := cur.String()
			cur.Reset()
			if evs1 := parseSSE([]byte(raw)); len(evs1) == 1 {
				evs = append(evs, timedEvent{raw: raw, sseEvent: evs1[0], at: time.Now()})
			}
		}
		if lerr != nil {
			if lerr != io.EOF {
				err = lerr
			}
			if rest := cur.String(); rest != "" && err == nil {
				err = fmt.Errorf("%d bytes after the last event: %q", len(rest), rest)
			}
			return resp, evs, sent, err
		}
	}
}

var (
	reChunkID = regexp.MustCompile(`"id":"[^"]*"`)
	reCreated = regexp.MustCompile(`"created":[0-9]+`)
)

// norm blanks what differs between two answers to the same request: the id and the
// creation time.
func norm(s string) string {
	return reCreated.ReplaceAllString(reChunkID.ReplaceAllString(s, `"id":"-"`), `"created":0`)
}

func rawOf(evs []timedEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(ev.raw)
	}
	return b.String()
}

func isJSON(s string) bool { return json.Valid([]byte(s)) }

// TestChaosHeaderAuthorization: the x-sluice-fault header is refused without the admin token
// (or with a wrong one), honoured with it or from an allowed network, rejected when
// malformed, and ignored when chaos is off.
func TestChaosHeaderAuthorization(t *testing.T) {
	hc := newHTTPClient(t)
	abort := "abort(status=503,side=downstream)"

	t.Run("enabled", func(t *testing.T) {
		g, s := oneSimChaos(t, "{enabled: true}")
		url := "http://" + g.addr + "/v1/chat/completions"

		resp, b := do(t, hc, http.MethodPost, url, chatBody, "x-sluice-fault", abort)
		e := checkErrorShape(t, resp, b, http.StatusForbidden, "fault_not_allowed")
		if e.Error.Type != "permission_error" {
			t.Errorf("no token: error type %q", e.Error.Type)
		}
		resp, b = do(t, hc, http.MethodPost, url, chatBody, "x-sluice-fault", abort, "x-sluice-admin-token", "wrong")
		checkErrorShape(t, resp, b, http.StatusForbidden, "fault_not_allowed")
		// The admin API's bearer form is not the header's authorization.
		resp, b = do(t, hc, http.MethodPost, url, chatBody, "x-sluice-fault", abort, "Authorization", "Bearer "+chaosToken)
		checkErrorShape(t, resp, b, http.StatusForbidden, "fault_not_allowed")
		if n := s.Stats().Requests; n != 0 {
			t.Errorf("refused fault requests reached the simulator: %d", n)
		}

		resp, b = do(t, hc, http.MethodPost, url, chatBody, faultHeader(abort)...)
		e = checkErrorShape(t, resp, b, http.StatusServiceUnavailable, "fault_injected")
		if !strings.Contains(e.Error.Message, "injected") {
			t.Errorf("abort message %q", e.Error.Message)
		}
		if n := s.Stats().Requests; n != 0 {
			t.Errorf("a downstream abort reached the simulator: %d", n)
		}
		rec := logFor(t, hc, g, resp.Header.Get("X-Request-Id"))
		if rec.FaultID != "header" || rec.Kind != "abort" || rec.Side != "downstream" || rec.Verdict != "to_client" || rec.Status != 503 {
			t.Errorf("log record %+v", rec)
		}

		for _, bad := range []string{"abort(status=200)", "explode", "stall(for=2s", "cut(after=x)", "stall(every=2,for=1s)"} {
			resp, b = do(t, hc, http.MethodPost, url, chatBody, faultHeader(bad)...)
			e = checkErrorShape(t, resp, b, http.StatusBadRequest, "invalid_fault")
			if !strings.Contains(e.Error.Message, "x-sluice-fault") {
				t.Errorf("%s: message %q does not name the header", bad, e.Error.Message)
			}
		}
		// A malformed header without the token is refused for the token first: an outside
		// client learns nothing about the syntax.
		resp, b = do(t, hc, http.MethodPost, url, chatBody, "x-sluice-fault", "explode")
		checkErrorShape(t, resp, b, http.StatusForbidden, "fault_not_allowed")

		// Without the header, nothing happens.
		if resp, b = do(t, hc, http.MethodPost, url, chatBody); resp.StatusCode != http.StatusOK {
			t.Errorf("plain request: %d %s", resp.StatusCode, b)
		}
	})

	t.Run("allowed network", func(t *testing.T) {
		g, _ := oneSimChaos(t, "{enabled: true, allowed_networks: [127.0.0.0/8]}")
		resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", chatBody, "x-sluice-fault", abort)
		checkErrorShape(t, resp, b, http.StatusServiceUnavailable, "fault_injected")
	})

	t.Run("disabled", func(t *testing.T) {
		g, s := oneSimChaos(t, "{enabled: false}")
		url := "http://" + g.addr + "/v1/chat/completions"
		for _, hdr := range [][]string{{"x-sluice-fault", abort}, faultHeader(abort), faultHeader("explode")} {
			resp, b := do(t, hc, http.MethodPost, url, chatBody, hdr...)
			if resp.StatusCode != http.StatusOK {
				t.Errorf("chaos off, header %q: %d %s", hdr, resp.StatusCode, b)
			}
		}
		if n := s.Stats().Completed; n != 3 {
			t.Errorf("simulator completed %d requests, want 3", n)
		}
		resp, b := adminCall(t, hc, g, http.MethodGet, "/admin/faults", "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"enabled": false`) {
			t.Errorf("GET /admin/faults with chaos off: %d %s", resp.StatusCode, b)
		}
	})
}

// TestChaosDownstream: each downstream fault, at SSE-event granularity, byte for byte against
// the unfaulted answer to the same request.
func TestChaosDownstream(t *testing.T) {
	g, _ := oneSimChaos(t, "{enabled: true}")
	hc := newHTTPClient(t)
	url := "http://" + g.addr + "/v1/chat/completions"
	stream := func(t *testing.T, spec string) ([]timedEvent, time.Time, error) {
		t.Helper()
		var hdr []string
		if spec != "" {
			hdr = faultHeader(spec)
		}
		resp, evs, sent, err := sseRead(t, hc, url, chaosStreamBody, hdr...)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("%s: status %d, content type %q", spec, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return evs, sent, err
	}

	base, _, err := stream(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(base) != 12 || base[11].data != "[DONE]" || !strings.Contains(base[10].data, `"usage":{`) {
		t.Fatalf("unfaulted stream: %d events, want role, 8 tokens, finish, usage, [DONE]:\n%s", len(base), rawOf(base))
	}
	baseText, _, _ := streamText(t, parseSSE([]byte(rawOf(base))))
	// Same request, same answer (temperature 0): the comparisons below rest on it.
	if again, _, _ := stream(t, ""); norm(rawOf(again)) != norm(rawOf(base)) {
		t.Fatalf("two unfaulted streams differ:\n%s\n%s", rawOf(base), rawOf(again))
	}

	t.Run("cut eof", func(t *testing.T) {
		evs, _, err := stream(t, "cut(after=3,mode=eof,side=downstream)")
		if err != nil {
			t.Fatalf("a clean cut ended with a read error: %v", err)
		}
		if got, want := norm(rawOf(evs)), norm(rawOf(base[:3])); got != want {
			t.Errorf("cut eof: got\n%q\nwant the first 3 events\n%q", got, want)
		}
	})

	t.Run("cut sse_error", func(t *testing.T) {
		evs, _, err := stream(t, "cut(after=3,mode=sse_error,side=downstream,message=boom)")
		if err != nil {
			t.Fatalf("read error: %v", err)
		}
		if len(evs) != 4 || norm(rawOf(evs[:3])) != norm(rawOf(base[:3])) {
			t.Fatalf("cut sse_error: %d events, want the first 3 and an error:\n%s", len(evs), rawOf(evs))
		}
		last := evs[3]
		if last.name != "error" || !strings.HasPrefix(last.raw, "event: error\ndata: {\"error\":{") || !strings.HasSuffix(last.raw, "}\n\n") {
			t.Errorf("last event %q, want event: error with an OpenAI error body", last.raw)
		}
		e := checkErrorJSON(t, []byte(last.data), "fault_injected")
		if e.Error.Message != "boom" {
			t.Errorf("error message %q, want the fault's", e.Error.Message)
		}
	})

	t.Run("cut reset", func(t *testing.T) {
		evs, _, err := stream(t, "cut(after=3,reset,side=downstream)")
		if err == nil {
			t.Fatalf("a reset stream ended cleanly after %d events", len(evs))
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) && !strings.Contains(err.Error(), "reset") && !strings.Contains(err.Error(), "EOF") {
			t.Errorf("read error %v, want a connection reset or unexpected EOF", err)
		}
		if norm(rawOf(evs)) != norm(rawOf(base[:3])) {
			t.Errorf("events before the reset:\n%s", rawOf(evs))
		}
		// The gateway keeps serving.
		if evs, _, err := stream(t, ""); err != nil || norm(rawOf(evs)) != norm(rawOf(base)) {
			t.Errorf("after a reset: %v\n%s", err, rawOf(evs))
		}
	})

	t.Run("malformed", func(t *testing.T) {
		evs, _, err := stream(t, "malformed(at=2,side=downstream)")
		if err != nil || len(evs) != len(base) {
			t.Fatalf("%v: %d events", err, len(evs))
		}
		for i, ev := range evs {
			switch {
			case i == 1:
				if isJSON(ev.data) {
					t.Errorf("event 2 is valid JSON: %s", ev.data)
				}
				if !strings.HasPrefix(norm(base[1].data), norm(ev.data)) || len(ev.data) < len(base[1].data)/3 {
					t.Errorf("event 2 %q is not a truncation of %q", ev.data, base[1].data)
				}
			case ev.data == "[DONE]":
			case !isJSON(ev.data):
				t.Errorf("event %d is not JSON: %s", i+1, ev.data)
			case norm(ev.raw) != norm(base[i].raw):
				t.Errorf("event %d changed: %q, want %q", i+1, ev.raw, base[i].raw)
			}
		}
	})

	t.Run("malformed invalid", func(t *testing.T) {
		evs, _, err := stream(t, "malformed(at=3,invalid,side=downstream)")
		if err != nil || len(evs) != len(base) {
			t.Fatalf("%v: %d events", err, len(evs))
		}
		if isJSON(evs[2].data) || !strings.HasSuffix(evs[2].data, ",}") {
			t.Errorf("event 3 %q, want a trailing comma", evs[2].data)
		}
	})

	t.Run("drop usage", func(t *testing.T) {
		evs, _, err := stream(t, "drop(usage,side=downstream)")
		if err != nil {
			t.Fatal(err)
		}
		want := append(append([]timedEvent(nil), base[:10]...), base[11])
		if norm(rawOf(evs)) != norm(rawOf(want)) {
			t.Errorf("drop usage: got\n%s\nwant every event but the usage chunk", rawOf(evs))
		}
		for _, ev := range evs {
			var c struct {
				Usage json.RawMessage `json:"usage"`
			}
			if ev.data != "[DONE]" && json.Unmarshal([]byte(ev.data), &c) == nil && len(c.Usage) > 0 && string(c.Usage) != "null" {
				t.Errorf("a chunk still carries usage: %s", ev.data)
			}
		}
	})

	t.Run("drop done", func(t *testing.T) {
		evs, _, err := stream(t, "drop(done,side=downstream)")
		if err != nil {
			t.Fatal(err)
		}
		if norm(rawOf(evs)) != norm(rawOf(base[:11])) {
			t.Errorf("drop done: got\n%s\nwant every event but [DONE]", rawOf(evs))
		}
	})

	t.Run("drift non-streaming", func(t *testing.T) {
		resp, plain := do(t, hc, http.MethodPost, url, chaosJSONBody)
		if resp.StatusCode != http.StatusOK || !bytes.Contains(plain, []byte(`"usage"`)) {
			t.Fatalf("unfaulted: %d %s", resp.StatusCode, plain)
		}
		resp, b := do(t, hc, http.MethodPost, url, chaosJSONBody, faultHeader("drift(remove=usage,side=downstream)")...)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("drift: %d %s", resp.StatusCode, b)
		}
		var got, want map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("drifted body is not JSON: %v: %s", err, b)
		}
		if _, ok := got["usage"]; ok {
			t.Errorf("drifted body still has usage: %s", b)
		}
		_ = json.Unmarshal([]byte(norm(string(plain))), &want)
		delete(want, "usage")
		_ = json.Unmarshal([]byte(norm(string(b))), &got)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("drift changed more than usage:\n got %s\nwant %s", b, plain)
		}
		if cl := resp.Header.Get("Content-Length"); cl != "" && cl != fmt.Sprint(len(b)) {
			t.Errorf("Content-Length %s for a body of %d bytes", cl, len(b))
		}
	})

	t.Run("drift streaming rename", func(t *testing.T) {
		evs, _, err := stream(t, "drift(rename=choices[].delta.content:text,side=downstream)")
		if err != nil || len(evs) != len(base) {
			t.Fatalf("%v: %d events", err, len(evs))
		}
		for i := 1; i < 9; i++ {
			want := strings.Replace(base[i].raw, `"content":`, `"text":`, 1)
			if norm(evs[i].raw) != norm(want) {
				t.Errorf("event %d: %q, want %q", i+1, evs[i].raw, want)
			}
		}
	})

	t.Run("corrupt", func(t *testing.T) {
		evs, _, err := stream(t, "corrupt(rate=1,seed=7,side=downstream)")
		if err != nil || len(evs) != len(base) {
			t.Fatalf("%v: %d events", err, len(evs))
		}
		for i, ev := range evs {
			if ev.data != "[DONE]" && !isJSON(ev.data) {
				t.Errorf("corrupted event %d is not JSON: %s", i+1, ev.data)
			}
		}
		text, done, _ := streamText(t, parseSSE([]byte(rawOf(evs))))
		if text == baseText || text == "" || !done {
			t.Errorf("corrupted text %q (done %v), want a text other than %q", text, done, baseText)
		}
		// The seed makes it repeatable.
		again, _, _ := stream(t, "corrupt(rate=1,seed=7,side=downstream)")
		if norm(rawOf(again)) != norm(rawOf(evs)) {
			t.Errorf("same seed, different corruption:\n%s\n%s", rawOf(evs), rawOf(again))
		}
	})

	t.Run("stall", func(t *testing.T) {
		evs, _, err := stream(t, "stall(after=2,for=300ms,side=downstream)")
		if err != nil {
			t.Fatal(err)
		}
		if norm(rawOf(evs)) != norm(rawOf(base)) {
			t.Fatalf("a stall changed the bytes:\n%s", rawOf(evs))
		}
		if gap := evs[2].at.Sub(evs[1].at); gap < 250*time.Millisecond {
			t.Errorf("gap between events 2 and 3: %v, want the 300ms stall", gap)
		}
		for i := 3; i < len(evs); i++ {
			if gap := evs[i].at.Sub(evs[i-1].at); gap >= 250*time.Millisecond {
				t.Errorf("the stall happened again: %v before event %d", gap, i+1)
			}
		}
	})

	t.Run("ttft", func(t *testing.T) {
		evs, sent, err := stream(t, "ttft(for=300ms,side=downstream)")
		if err != nil {
			t.Fatal(err)
		}
		if norm(rawOf(evs)) != norm(rawOf(base)) {
			t.Fatalf("a ttft hold changed the bytes:\n%s", rawOf(evs))
		}
		if d := evs[0].at.Sub(sent); d < 250*time.Millisecond {
			t.Errorf("first event after %v, want the 300ms hold", d)
		}
		if d := evs[len(evs)-1].at.Sub(evs[0].at); d >= 250*time.Millisecond {
			t.Errorf("events after the first took %v, want no further wait", d)
		}
	})

	// Every one of these was delivered to the client as meant.
	for _, r := range faultLog(t, hc, g) {
		if r.Side != "downstream" || r.FaultID != "header" || r.Verdict != "to_client" {
			t.Errorf("log record %+v, want header downstream faults delivered to the client", r)
		}
	}
}

// chaosRoutes is a route "chat" on cluster primary with a fallback to backup.
func chaosRoutes(extra string) string {
	return "  - name: chat\n    cluster: primary\n    fallback: [{cluster: backup}]\n" + extra
}

// TestChaosUpstream: upstream faults stand in for a failing model server, and the gateway's own
// policies (fallback, TTFT time-out, resume, in-band errors) react to them end to end.
func TestChaosUpstream(t *testing.T) {
	hc := newHTTPClient(t)

	t.Run("abort then fallback", func(t *testing.T) {
		primary := startRoutingUpstream(t, sim.Config{}, -1)
		backup := startRoutingUpstream(t, sim.Config{}, -1)
		g := startChaos(t, "{enabled: true}", chaosRoutes(""), "primary", primary.URL, "backup", backup.URL)
		resp, b := adminCall(t, hc, g, http.MethodPut, "/admin/faults", `[{"id":"p503","kind":"abort","status":503,"cluster":"primary"}]`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT /admin/faults: %d %s", resp.StatusCode, b)
		}
		client := newClient(t, g.addr)
		var hresp *http.Response
		_, err := client.Chat.Completions.New(testCtx(t), routingParams("hello", 4), option.WithResponseInto(&hresp))
		if err != nil {
			t.Fatalf("an upstream abort reached the client: %v", err)
		}
		if r := routedOf(hresp); r != (routed{"backup", 2}) {
			t.Errorf("served by %+v, want backup after 2 attempts", r)
		}
		if p := primary.requests.Load(); p != 0 {
			t.Errorf("the aborted attempt reached the primary (%d requests): an abort stands in for it", p)
		}
		rec := logFor(t, hc, g, hresp.Header.Get("X-Request-Id"))
		if rec.FaultID != "p503" || rec.Side != "upstream" || rec.Verdict != "survived" || !rec.Fallback || rec.Status != 200 || rec.Cluster != "backup" || rec.Attempts != 2 {
			t.Errorf("log record %+v, want p503 survived by fallback to backup", rec)
		}
		if v := metricValue(t, hc, g.admin, "sluice_chaos_injected_total", `kind="abort"`, `side="upstream"`); v != 1 {
			t.Errorf(`sluice_chaos_injected_total{kind="abort",side="upstream"} = %v, want 1`, v)
		}
		if v := metricValue(t, hc, g.admin, "sluice_chaos_survived_total", `kind="abort"`); v != 1 {
			t.Errorf("sluice_chaos_survived_total = %v, want 1", v)
		}
	})

	t.Run("ttft then fallback", func(t *testing.T) {
		primary := startRoutingUpstream(t, sim.Config{}, -1)
		backup := startRoutingUpstream(t, sim.Config{}, -1)
		g := startChaos(t, "{enabled: true}", chaosRoutes("    timeouts: {ttft: 300ms}\n"), "primary", primary.URL, "backup", backup.URL)
		client := newClient(t, g.addr, option.WithHeader("x-sluice-fault", "ttft(for=2s,cluster=primary)"),
			option.WithHeader("x-sluice-admin-token", chaosToken))
		t0 := time.Now()
		var hresp *http.Response
		st := client.Chat.Completions.NewStreaming(testCtx(t), routingParams("tell me", 8), option.WithResponseInto(&hresp))
		var acc openai.ChatCompletionAccumulator
		for st.Next() {
			acc.AddChunk(st.Current())
		}
		err := st.Err()
		_ = st.Close()
		el := time.Since(t0)
		if err != nil || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
			t.Fatalf("err %v, answer %+v", err, acc.Choices)
		}
		if r := routedOf(hresp); r != (routed{"backup", 2}) {
			t.Errorf("served by %+v, want backup after 2 attempts", r)
		}
		if el < 250*time.Millisecond || el > 1500*time.Millisecond {
			t.Errorf("took %v, want the 300ms TTFT budget and little more (the hold is 2s)", el)
		}
		rec := logFor(t, hc, g, hresp.Header.Get("X-Request-Id"))
		if rec.Kind != "ttft" || rec.Verdict != "survived" || !rec.Fallback {
			t.Errorf("log record %+v, want ttft survived by fallback", rec)
		}
		// The primary answered at once; the hold is the gateway reading it.
		if p := primary.requests.Load(); p != 1 {
			t.Errorf("primary saw %d requests, want 1", p)
		}
	})

	// The uncut answer, straight from a simulator.
	params := routingParams("Tell me a long story about a lighthouse.", 40)
	params.Temperature = openai.Float(0)
	ignoreEOS := option.WithJSONSet("ignore_eos", true)
	ref := startRoutingUpstream(t, sim.Config{}, -1)
	direct := openai.NewClient(option.WithBaseURL(ref.URL+"/v1/"), option.WithAPIKey("sk-e2e"), option.WithMaxRetries(0),
		option.WithHTTPClient(hc))
	want, err := direct.Chat.Completions.New(testCtx(t), params, ignoreEOS)
	if err != nil {
		t.Fatal(err)
	}
	wantText := want.Choices[0].Message.Content
	cut := "{enabled: true, faults: [{id: cut5, kind: cut, cluster: primary, after_events: 5, mode: reset}]}"

	t.Run("cut without resume", func(t *testing.T) {
		primary := startRoutingUpstream(t, sim.Config{}, -1)
		backup := startRoutingUpstream(t, sim.Config{}, -1)
		g := startChaos(t, cut, chaosRoutes(""), "primary", primary.URL, "backup", backup.URL)
		client := newClient(t, g.addr, ignoreEOS)
		var hresp *http.Response
		st := client.Chat.Completions.NewStreaming(testCtx(t), params, option.WithResponseInto(&hresp))
		n := 0
		var acc openai.ChatCompletionAccumulator
		for st.Next() {
			acc.AddChunk(st.Current())
			n++
		}
		err := st.Err()
		_ = st.Close()
		if err == nil || !strings.Contains(err.Error(), "stream_cut") {
			t.Fatalf("after %d chunks: %v, want the in-band stream_cut error", n, err)
		}
		if n != 5 {
			t.Errorf("%d chunks before the cut, want 5", n)
		}
		if got := acc.Choices[0].Message.Content; !strings.HasPrefix(wantText, got) || len(strings.Fields(got)) != 4 {
			t.Errorf("text before the cut %q, want the first 4 words of %q", got, wantText)
		}
		rec := logFor(t, hc, g, hresp.Header.Get("X-Request-Id"))
		if rec.FaultID != "cut5" || rec.Verdict != "client_error" || rec.ErrorClass != "stream_cut" || rec.Fallback {
			t.Errorf("log record %+v, want cut5 client_error stream_cut", rec)
		}
		if b := backup.requests.Load(); b != 0 {
			t.Errorf("backup saw %d requests without resume", b)
		}
		if v := metricValue(t, hc, g.admin, "sluice_chaos_client_errors_total", `kind="cut"`, `side="upstream"`); v != 1 {
			t.Errorf("sluice_chaos_client_errors_total{kind=cut} = %v, want 1", v)
		}
	})

	t.Run("cut with resume", func(t *testing.T) {
		primary := startRoutingUpstream(t, sim.Config{}, -1)
		backup := startRoutingUpstream(t, sim.Config{}, -1)
		g := startChaos(t, cut, chaosRoutes("    resume: true\n"), "primary", primary.URL, "backup", backup.URL)
		client := newClient(t, g.addr, ignoreEOS)
		var hresp *http.Response
		st := client.Chat.Completions.NewStreaming(testCtx(t), params, option.WithResponseInto(&hresp))
		var acc openai.ChatCompletionAccumulator
		for st.Next() {
			acc.AddChunk(st.Current())
		}
		err := st.Err()
		_ = st.Close()
		if err != nil {
			t.Fatalf("resumed stream ended with an error: %v", err)
		}
		if got := acc.Choices[0].Message.Content; got != wantText {
			t.Errorf("resumed answer differs from the uncut one:\n got %q\nwant %q", got, wantText)
		}
		if b := backup.requests.Load(); b != 1 {
			t.Errorf("backup saw %d continuation requests, want 1", b)
		}
		rec := logFor(t, hc, g, hresp.Header.Get("X-Request-Id"))
		if rec.FaultID != "cut5" || rec.Verdict != "survived" || !rec.Fallback || rec.Status != 200 {
			t.Errorf("log record %+v, want cut5 survived by resume on the fallback", rec)
		}
	})

	t.Run("malformed", func(t *testing.T) {
		primary := startRoutingUpstream(t, sim.Config{}, -1)
		backup := startRoutingUpstream(t, sim.Config{}, -1)
		g := startChaos(t, "{enabled: true}", chaosRoutes("    timeouts: {total: 5s}\n"), "primary", primary.URL, "backup", backup.URL)
		url := "http://" + g.addr + "/v1/chat/completions"
		t0 := time.Now()
		resp, evs, _, err := sseRead(t, hc, url, chaosStreamBody, faultHeader("malformed(at=3,cluster=primary)")...)
		if el := time.Since(t0); el > 3*time.Second {
			t.Errorf("a malformed upstream chunk took %v", el)
		}
		if resp.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("status %d, read error %v", resp.StatusCode, err)
		}
		// The gateway never relays a chunk the client cannot decode: the two good events,
		// then an in-band error naming the malformed chunk, and no [DONE].
		if len(evs) != 3 || evs[2].name != "error" || !strings.Contains(evs[2].data, `"code":"upstream_malformed"`) {
			t.Errorf("%d events, event 3 %q:\n%s", len(evs), evs[min(2, len(evs)-1)].data, rawOf(evs))
		}
		for i, ev := range evs {
			if !isJSON(ev.data) {
				t.Errorf("event %d is not JSON: %s", i+1, ev.data)
			}
		}
		rec := logFor(t, hc, g, resp.Header.Get("X-Request-Id"))
		if rec.Kind != "malformed" || rec.Verdict != "client_error" || rec.ErrorClass != "stream_cut" {
			t.Errorf("log record %+v", rec)
		}
		// openai-go sees a clear decoding error, no hang.
		client := newClient(t, g.addr, option.WithHeader("x-sluice-fault", "malformed(at=3,cluster=primary)"),
			option.WithHeader("x-sluice-admin-token", chaosToken))
		st := client.Chat.Completions.NewStreaming(testCtx(t), routingParams("hi", 8))
		n := 0
		for st.Next() {
			n++
		}
		if st.Err() == nil {
			t.Errorf("openai-go read a malformed chunk without an error (%d chunks)", n)
		}
		_ = st.Close()
		// The gateway serves the next request.
		resp, evs, _, err = sseRead(t, hc, url, chaosStreamBody)
		if resp.StatusCode != http.StatusOK || err != nil || len(evs) != 12 {
			t.Errorf("next request: %d %v, %d events", resp.StatusCode, err, len(evs))
		}
	})
}

// TestChaosAdmin: the admin API replaces the set (validated whole), adds one, lists with
// counts, and clears it (the kill switch, which also ends a stall in flight); the log names the
// requests.
func TestChaosAdmin(t *testing.T) {
	g, _ := oneSimChaos(t, "{enabled: true, faults: [{id: cfg1, kind: delay, for: 1ms, percent: 0}]}")
	hc := newHTTPClient(t)
	url := "http://" + g.addr + "/v1/chat/completions"

	if fs := listFaults(t, hc, g); len(fs) != 1 || fs[0].ID != "cfg1" {
		t.Fatalf("configured faults %+v", fs)
	}
	resp, b := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/faults", "")
	checkErrorShape(t, resp, b, http.StatusUnauthorized, "invalid_admin_token")

	resp, b = adminCall(t, hc, g, http.MethodPut, "/admin/faults",
		`[{"id":"a429","kind":"abort","side":"downstream","status":429,"retry_after":"2s","every":2},{"kind":"drop","side":"downstream","mode":"done"}]`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %d %s", resp.StatusCode, b)
	}
	fs := listFaults(t, hc, g)
	if len(fs) != 2 || fs[0].ID != "a429" || fs[1].ID == "" {
		t.Fatalf("after PUT: %+v", fs)
	}

	// A bad set is refused whole, every problem named; the old set stays.
	resp, b = adminCall(t, hc, g, http.MethodPut, "/admin/faults",
		`[{"kind":"abort","status":200},{"kind":"explode"},{"kind":"stall","side":"downstream"}]`)
	e := checkErrorShape(t, resp, b, http.StatusBadRequest, "invalid_faults")
	for _, p := range []string{"faults[0].status", "faults[1].kind", "faults[2].for"} {
		if !strings.Contains(e.Error.Message, p) {
			t.Errorf("PUT error does not name %s: %q", p, e.Error.Message)
		}
	}
	resp, b = adminCall(t, hc, g, http.MethodPut, "/admin/faults", `[{"kind":"abort","bogus":1}]`)
	checkErrorShape(t, resp, b, http.StatusBadRequest, "invalid_json")
	if fs := listFaults(t, hc, g); len(fs) != 2 || fs[0].ID != "a429" {
		t.Fatalf("a refused PUT changed the set: %+v", fs)
	}

	// POST adds one.
	resp, b = adminCall(t, hc, g, http.MethodPost, "/admin/faults", `{"kind":"drift","side":"downstream","remove":["usage"]}`)
	var added struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &added) != nil || added.ID == "" {
		t.Fatalf("POST: %d %s", resp.StatusCode, b)
	}
	resp, b = adminCall(t, hc, g, http.MethodPost, "/admin/faults", `{"kind":"drift"}`)
	checkErrorShape(t, resp, b, http.StatusBadRequest, "invalid_fault")
	if fs := listFaults(t, hc, g); len(fs) != 3 || fs[2].ID != added.ID {
		t.Fatalf("after POST: %+v", fs)
	}

	// Four requests: every second one is aborted (429 with Retry-After), the others get the
	// drift (no usage) and the drop (no [DONE] for a stream; nothing to drop here).
	var ids []string
	for i := range 4 {
		resp, b := do(t, hc, http.MethodPost, url, chaosJSONBody)
		ids = append(ids, resp.Header.Get("X-Request-Id"))
		if i%2 == 1 {
			checkErrorShape(t, resp, b, http.StatusTooManyRequests, "fault_injected")
			if ra := resp.Header.Get("Retry-After"); ra != "2" {
				t.Errorf("Retry-After %q, want 2", ra)
			}
			continue
		}
		if resp.StatusCode != http.StatusOK || bytes.Contains(b, []byte(`"usage"`)) {
			t.Errorf("request %d: %d %s, want 200 without usage", i, resp.StatusCode, b)
		}
	}
	fired := map[string]uint64{}
	planned := map[string]uint64{}
	for _, f := range listFaults(t, hc, g) {
		fired[f.ID], planned[f.ID] = f.Fired, f.Planned
	}
	if fired["a429"] != 2 || planned["a429"] != 2 || fired[added.ID] != 2 {
		t.Errorf("fired %v planned %v, want a429 fired twice and the drift twice", fired, planned)
	}

	// The log names each request by the id the client got.
	for i, id := range ids {
		found := false
		for _, r := range faultLog(t, hc, g) {
			if r.RequestID == id && r.FaultID == "a429" && r.Verdict == "to_client" && r.Status == 429 {
				found = true
			}
		}
		if found != (i%2 == 1) {
			t.Errorf("request %d (%s): abort logged %v", i, id, found)
		}
	}
	if v := metricValue(t, hc, g.admin, "sluice_chaos_injected_total", `kind="abort"`, `side="downstream"`); v != 2 {
		t.Errorf(`sluice_chaos_injected_total{kind="abort",side="downstream"} = %v, want 2`, v)
	}

	// The kill switch: a long stall in flight ends promptly, and nothing is faulted after.
	resp, b = adminCall(t, hc, g, http.MethodPut, "/admin/faults", `[{"kind":"stall","side":"downstream","after_events":2,"for":"20s"}]`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT stall: %d %s", resp.StatusCode, b)
	}
	type result struct {
		evs []timedEvent
		err error
	}
	done := make(chan result, 1)
	go func() {
		_, evs, _, err := sseDo(hc, url, chaosStreamBody)
		done <- result{evs, err}
	}()
	eventually(t, 5*time.Second, "the stall is active", func() bool {
		fs := listFaults(t, hc, g)
		return len(fs) == 1 && fs[0].Fired == 1
	})
	time.Sleep(50 * time.Millisecond)
	resp, b = adminCall(t, hc, g, http.MethodDelete, "/admin/faults", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
	}
	killed := time.Now()
	select {
	case r := <-done:
		if el := time.Since(killed); el > 2*time.Second {
			t.Errorf("the stream went on %v after the kill switch", el)
		}
		if r.err != nil || len(r.evs) != 12 || r.evs[11].data != "[DONE]" {
			t.Errorf("stalled stream after the kill switch: %v, %d events", r.err, len(r.evs))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a stall in flight did not end within 10s of the kill switch")
	}
	if fs := listFaults(t, hc, g); len(fs) != 0 {
		t.Errorf("after DELETE: %+v", fs)
	}
	if resp, b := do(t, hc, http.MethodPost, url, chaosJSONBody); resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"usage"`)) {
		t.Errorf("after DELETE: %d %s", resp.StatusCode, b)
	}
}

// TestChaosFrequency: percent fires on about its share of requests, every on exactly every
// Nth.
func TestChaosFrequency(t *testing.T) {
	g, s := oneSimChaos(t, "{enabled: true, faults: [{id: half, kind: abort, side: downstream, percent: 50}]}")
	hc := newHTTPClient(t)
	url := "http://" + g.addr + "/v1/chat/completions"

	const n = 200
	aborted := 0
	for range n {
		resp, b := do(t, hc, http.MethodPost, url, chatBody)
		switch resp.StatusCode {
		case http.StatusServiceUnavailable:
			aborted++
		case http.StatusOK:
		default:
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	}
	// Binomial(200, 0.5): sd 7.1; 60..140 is more than 5 sd either way.
	if aborted < 60 || aborted > 140 {
		t.Errorf("percent 50 aborted %d of %d requests", aborted, n)
	}
	if fs := listFaults(t, hc, g); len(fs) != 1 || fs[0].Fired != uint64(aborted) || fs[0].Planned != uint64(aborted) {
		t.Errorf("faults %+v, want half fired %d times", fs, aborted)
	}
	if c := s.Stats().Completed; c != int64(n-aborted) {
		t.Errorf("simulator completed %d, want %d", c, n-aborted)
	}

	resp, b := adminCall(t, hc, g, http.MethodPut, "/admin/faults", `[{"id":"fourth","kind":"abort","side":"downstream","every":4}]`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %d %s", resp.StatusCode, b)
	}
	for i := 1; i <= 40; i++ {
		resp, _ := do(t, hc, http.MethodPost, url, chatBody)
		if want := i%4 == 0; (resp.StatusCode == http.StatusServiceUnavailable) != want {
			t.Errorf("request %d: status %d, aborted want %v", i, resp.StatusCode, want)
		}
	}
	if fs := listFaults(t, hc, g); len(fs) != 1 || fs[0].Fired != 10 {
		t.Errorf("faults %+v, want fourth fired 10 times", fs)
	}
}
