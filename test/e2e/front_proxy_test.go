package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicegw/sluice/test/sim"
)

// TestBehindReverseProxy: the gateway behind a proxy that keeps HTTP/1.1 connections to it
// alive and adds X-Forwarded-For (as an edge proxy or a load balancer does): streams with
// their usage chunk arrive whole, answers too, and a client that leaves mid-stream still cancels the model
// server's work (the proxy drops its connection to the gateway, which sees it).
func TestBehindReverseProxy(t *testing.T) {
	s := startSim(t, sim.Config{ITL: 5 * time.Millisecond})
	g := startGateway(t, oneRoute("", "", s.URL))
	u, err := url.Parse("http://" + g.addr)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	t.Cleanup(tr.CloseIdleConnections)
	rp.Transport, rp.FlushInterval = tr, -1
	// The front buffers each request body before it proxies it, as nginx does by default
	// (proxy_request_buffering on). Without that, net/http's server and Transport race: the
	// server drains and closes the request body when the handler writes the answer's head,
	// while the Transport, which has sent the body's declared length, reads it once more for
	// bytes beyond it; that read fails and the Transport drops the connection to the gateway
	// mid-answer (golang/go#40747). A gateway that answers at once loses that race now and
	// then; the cut stream is the front proxy's defect, not the gateway's.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	addr := strings.TrimPrefix(front.URL, "http://")

	t.Run("stream with usage", func(t *testing.T) {
		client := newClient(t, addr)
		p := chatParams(12)
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(testCtx(t), p)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Usage.CompletionTokens == 0 {
			t.Fatalf("choices %d, usage %+v", len(acc.Choices), acc.Usage)
		}
	})
	t.Run("answers on kept-alive connections", func(t *testing.T) {
		client := newClient(t, addr)
		for i := range 5 {
			resp, err := client.Chat.Completions.New(testCtx(t), chatParams(4))
			if err != nil || len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
				t.Fatalf("request %d: %v %+v", i, err, resp)
			}
		}
	})
	t.Run("client leaves mid-stream", func(t *testing.T) {
		before := s.Stats().Cancelled
		client := newClient(t, addr, option.WithJSONSet("ignore_eos", true))
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		stream := client.Chat.Completions.NewStreaming(ctx, chatParams(2000)) // 10 s if nothing cancels it
		for i := range 3 {
			if !stream.Next() {
				t.Fatalf("stream ended after %d chunks: %v", i, stream.Err())
			}
		}
		cancel()
		_ = stream.Close()
		eventually(t, 5*time.Second, "the simulator saw the cancellation", func() bool { return s.Stats().Cancelled == before+1 })
	})
}
