package e2e

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicegw/sluice/proxy/telemetry"
	"github.com/sluicegw/sluice/test/sim"
)

// TestTraceSpans: the spans follow the OTel GenAI conventions. The server span is named
// "{operation} {model}", carries the route, the operation and the usage, the finish reasons
// and the response id; a failed attempt's client span has error.type and an error status.
func TestTraceSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel, err := telemetry.New(context.Background(), telemetry.Options{SpanExporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	primary := startRoutingUpstream(t, sim.Config{}, -1)
	primary.status.Store(http.StatusInternalServerError)
	backup := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
`, "primary", primary.URL, "backup", backup.URL), gatewayOpts{telemetry: tel})
	client := newClient(t, g.addr)
	resp, err := client.Chat.Completions.New(testCtx(t), routingParams("hello", 4))
	if err != nil {
		t.Fatal(err)
	}

	var server tracetest.SpanStub
	var clients []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		switch s.SpanKind {
		case trace.SpanKindServer:
			server = s
		case trace.SpanKindClient:
			clients = append(clients, s)
		}
	}
	if server.Name != "chat sim-llama" {
		t.Errorf("server span %q, want %q", server.Name, "chat sim-llama")
	}
	attrs := func(s tracetest.SpanStub) map[string]any {
		m := map[string]any{}
		for _, kv := range s.Attributes {
			m[string(kv.Key)] = kv.Value.AsInterface()
		}
		return m
	}
	sa := attrs(server)
	for k, want := range map[string]any{
		"sluice.route":               "chat",
		"gen_ai.operation.name":      "chat",
		"gen_ai.provider.name":       "openai",
		"gen_ai.request.model":       "sim-llama",
		"gen_ai.request.max_tokens":  int64(4),
		"gen_ai.usage.output_tokens": resp.Usage.CompletionTokens,
		"gen_ai.usage.input_tokens":  resp.Usage.PromptTokens,
		"gen_ai.response.id":         resp.ID,
		"http.response.status_code":  int64(200),
	} {
		if sa[k] != want {
			t.Errorf("server span %s = %v (%T), want %v (%T)", k, sa[k], sa[k], want, want)
		}
	}
	if fr, _ := sa["gen_ai.response.finish_reasons"].([]string); len(fr) != 1 || fr[0] != string(resp.Choices[0].FinishReason) {
		t.Errorf("server span finish_reasons %v, want [%s]", sa["gen_ai.response.finish_reasons"], resp.Choices[0].FinishReason)
	}
	if len(clients) != 2 {
		t.Fatalf("%d client spans, want 2 (the failed primary, the fallback)", len(clients))
	}
	failed, ok := clients[0], clients[1]
	if fa := attrs(failed); fa["error.type"] != "upstream_5xx" || fa["http.response.status_code"] != int64(500) ||
		failed.Status.Code != codes.Error || fa["gen_ai.operation.name"] != "chat" {
		t.Errorf("failed attempt span: status %v, attributes %v", failed.Status, fa)
	}
	if oa := attrs(ok); oa["gen_ai.usage.output_tokens"] != resp.Usage.CompletionTokens || oa["sluice.cluster"] != "backup" || ok.Status.Code == codes.Error {
		t.Errorf("fallback attempt span: status %v, attributes %v", ok.Status, oa)
	}
}
