package guard

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluicegw/sluice/policy"
)

// The Admit benchmarks run the estimator path: a full Admit and settle (breaker Allow and
// done, surge p95 and baseline feed, in-flight and ticket bookkeeping) with the default
// params plus max_prompt_tokens and a context window far from the prompt, and a warm surge
// baseline of prompts of the same size (so the surge limit applies: 3× away, or the floor).
// The prompt is a chat of 4 messages of about n/4 tokens each. The AllSignals variants add
// repetition (which extracts the text from the body and hashes up to 32 KB of it).
//
//	go test -run '^$' -bench . -benchmem ./policy/guard/

func benchRequest(b testing.TB, tokens int) *policy.Request {
	var parts []string
	for i := range 4 {
		parts = append(parts, words(tokens/16, i)+" "+prose(tokens/8))
	}
	r := chat(b, "tenant-a", 256, parts...)
	return r
}

func benchAdmit(b *testing.B, tokens int, p Params) {
	r := benchRequest(b, tokens)
	p.MaxPromptTokens = 100 * tokens
	p.ContextWindow = 200 * tokens
	g := newGuard(b, p, policy.SystemClock{})
	for range 200 {
		admitOK(b, g, r, ok200)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		d, _ := g.Admit(ctx, r)
		if d.Reject != nil {
			b.Fatal(d.Reject)
		}
		d.Done(ok200)
	}
	b.StopTimer()
	if s := g.Stats(); s.ExactCounts != 0 {
		b.Fatalf("%d exact counts on the estimator path", s.ExactCounts)
	}
}

func BenchmarkAdmit1k(b *testing.B)  { benchAdmit(b, 1000, Params{}) }
func BenchmarkAdmit32k(b *testing.B) { benchAdmit(b, 32000, Params{}) }

func BenchmarkAdmit1kAllSignals(b *testing.B) {
	benchAdmit(b, 1000, Params{MaxMessages: 100, MaxRepetition: 0.5})
}

func BenchmarkAdmit32kAllSignals(b *testing.B) {
	benchAdmit(b, 32000, Params{MaxMessages: 100, MaxRepetition: 0.5})
}

func benchExact(b *testing.B, tokens int) {
	r := benchRequest(b, tokens)
	tk, err := encoder("cl100k_base")
	if err != nil {
		b.Fatal(err)
	}
	n := exactOf(b, r)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var pt promptText
		extractText(r.Kind, r.Body, &pt)
		if got := exactCount(tk, &pt, r.Messages); got != n {
			b.Fatal(fmt.Sprint(got, n))
		}
	}
	b.ReportMetric(float64(n), "tokens")
}

func BenchmarkExactCount1k(b *testing.B)  { benchExact(b, 1000) }
func BenchmarkExactCount32k(b *testing.B) { benchExact(b, 32000) }
