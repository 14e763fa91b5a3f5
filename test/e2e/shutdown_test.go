package e2e

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/test/sim"
)

// TestShutdownInProcess: Server.Shutdown with a drain deadline. A request still waiting for
// its first byte at the deadline gets 503 shutdown (with Retry-After); a stream that has
// started gets an in-band error event; Shutdown returns nil and new connections are refused.
func TestShutdownInProcess(t *testing.T) {
	s := startSim(t, sim.Config{ITL: 10 * time.Millisecond})
	g := startGateway(t, oneRoute("", "", s.URL))
	hc := newHTTPClient(t)
	url := "http://" + g.addr + "/v1/chat/completions"

	type answer struct {
		resp *http.Response
		body []byte
		err  error
	}
	send := func(body string, hdr ...string) chan answer {
		ch := make(chan answer, 1)
		go func() {
			req, _ := http.NewRequest("POST", url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			resp, err := hc.Do(req)
			if err != nil {
				ch <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			var b strings.Builder
			buf := make([]byte, 4096)
			for {
				n, rerr := resp.Body.Read(buf)
				b.Write(buf[:n])
				if rerr != nil {
					break
				}
			}
			ch <- answer{resp: resp, body: []byte(b.String())}
		}()
		return ch
	}
	waiting := send(chatBody, "x-sim-stall-first", "20s")
	streaming := send(`{"model":"sim-llama","stream":true,"max_tokens":2000,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`)
	eventually(t, 5*time.Second, "both requests reached the simulator", func() bool {
		st := s.Stats()
		return st.Requests == 2 && st.GenerationTokens > 3
	})

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := g.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown past the drain deadline = %v, want nil", err)
	}
	if _, err := net.DialTimeout("tcp", g.addr, time.Second); err == nil {
		t.Error("gateway still accepts connections after Shutdown")
	}

	for name, ch := range map[string]chan answer{"waiting": waiting, "streaming": streaming} {
		var a answer
		select {
		case a = <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer after Shutdown", name)
		}
		if a.err != nil {
			t.Fatalf("%s: %v", name, a.err)
		}
		switch name {
		case "waiting":
			checkErrorShape(t, a.resp, a.body, http.StatusServiceUnavailable, "shutdown")
			if a.resp.Header.Get("Retry-After") == "" {
				t.Error("503 shutdown without Retry-After")
			}
		case "streaming":
			evs := parseSSE(a.body)
			if len(evs) < 2 || evs[len(evs)-1].name != "error" {
				t.Fatalf("stream at the drain deadline ended with %+v", evs[len(evs)-1])
			}
			checkErrorJSON(t, []byte(evs[len(evs)-1].data), "shutdown")
		}
	}
	eventually(t, 5*time.Second, "upstream requests cancelled", func() bool { return s.Stats().Cancelled == 2 })
	// The test's cleanup calls Shutdown again: it must be harmless.
	if err := g.srv.Shutdown(context.Background()); err != nil && !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("second Shutdown: %v", err)
	}
}
