package route

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluicegw/sluice/policy"
)

// benchSpec is a sticky weighted route of three splits and two fallbacks.
func benchSpec() Spec {
	return Spec{
		Splits: []Split{
			{Cluster: "llama-primary", Weight: 90},
			{Cluster: "llama-candidate", Weight: 5, GrayFlag: "v2", Model: "llama-3-70b-v2"},
			{Cluster: "llama-other", Weight: 5},
		},
		Fallback: []Step{
			{Cluster: "small-fallback", Model: "llama-3-8b", On: []string{"5xx", "429", "ttft_timeout", "breaker_open"}},
			{Cluster: "last-resort"},
		},
	}
}

func BenchmarkPlan(b *testing.B) {
	rt := mustNew(b, benchSpec(), "", "")
	reqs := make([]*policy.Request, 1024)
	for i := range reqs {
		r := req(fmt.Sprintf("session-%d", i))
		r.Header.Set("Authorization", "Bearer sk-bench")
		reqs[i] = r
	}
	ctx := context.Background()
	b.Run("sticky", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			rt.Plan(ctx, reqs[i&1023])
			i++
		}
	})
	b.Run("no-key", func(b *testing.B) {
		r := req("")
		b.ReportAllocs()
		for b.Loop() {
			rt.Plan(ctx, r)
		}
	})
	b.Run("gray-flag", func(b *testing.B) {
		r := req("s")
		r.GrayFlag = "v2"
		b.ReportAllocs()
		for b.Loop() {
			rt.Plan(ctx, r)
		}
	})
}

func BenchmarkBudgetTryRetry(b *testing.B) {
	bg := NewBudgets(BudgetRule{0.2, 3}, BudgetRule{1, 3}, []string{"a"}, nil)
	b.ReportAllocs()
	for b.Loop() {
		bg.RecordRequest()
		bg.RecordSend("a")
		bg.TryRetry("a")
	}
}

func BenchmarkBreakerAllow(b *testing.B) {
	br := NewBreakers(Breaker{}, "a")
	b.ReportAllocs()
	for b.Loop() {
		done, ok := br.Allow("a")
		if ok {
			done.End(false, false)
		}
	}
}
