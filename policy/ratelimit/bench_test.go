package ratelimit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// BenchmarkAdmit measures one admitted request end to end: Admit (keyring lookup by the
// handler excluded), the x-ratelimit-* headers, and reconciliation in Done.
//
//	go test -run '^$' -bench . -benchmem ./policy/ratelimit/
func BenchmarkAdmit(b *testing.B) {
	cases := []struct {
		name    string
		p       Params
		tenants int
	}{
		{"requests+tokens/1 tenant", Params{RequestsPerMinute: 1e12, TokensPerMinute: 1e15}, 1},
		{"requests+tokens/1000 tenants", Params{RequestsPerMinute: 1e12, TokensPerMinute: 1e15}, 1000},
		{"tokens only", Params{TokensPerMinute: 1e15}, 1},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			l := newLimiter(b, c.p, policy.SystemClock{})
			reqs := make([]*policy.Request, c.tenants)
			for i := range reqs {
				reqs[i] = chat("tenant-"+strconv.Itoa(i), "chat", 1000, 256)
			}
			ctx := context.Background()
			out := policy.Outcome{Status: 200, InputTokens: 1000, OutputTokens: 100}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				d, _ := l.Admit(ctx, reqs[i%len(reqs)])
				if d.Reject != nil {
					b.Fatal(d.Reject)
				}
				d.Done(out)
			}
		})
	}
	// Charges that used to cost one reservation per bucketful: now one bucket operation each.
	b.Run("borrowed charge of 10000 buckets", func(b *testing.B) {
		// burst 0.0001: a bucket of 1e8 tokens, a per-minute limit of 1e12, charges of 1e12.
		// Done refunds all but one token, so the bucket is (nearly) full for the next one.
		l := newLimiter(b, Params{RequestsPerMinute: 1e12, TokensPerMinute: 1e12, Burst: 0.0001, MaxWait: policy.Duration(time.Minute)}, policy.SystemClock{})
		l.sleep = func(context.Context, time.Duration) error { return nil } // the wait for a full bucket
		r := chat("tenant", "chat", 1e12-256, 256)
		out := policy.Outcome{Status: 200, InputTokens: 1}
		b.ReportAllocs()
		for b.Loop() {
			d, _ := l.Admit(context.Background(), r)
			if d.Reject != nil {
				b.Fatal(d.Reject)
			}
			d.Done(out)
		}
	})
	b.Run("too large (refused)", func(b *testing.B) {
		l := newLimiter(b, Params{RequestsPerMinute: 1e12, TokensPerMinute: 30000}, policy.SystemClock{})
		r := chat("tenant", "chat", 10, 4096)
		r.N = 200000000
		b.ReportAllocs()
		for b.Loop() {
			if d, _ := l.Admit(context.Background(), r); d.Reject == nil {
				b.Fatal("admitted")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		l := newLimiter(b, Params{RequestsPerMinute: 1e12, TokensPerMinute: 1e15}, policy.SystemClock{})
		out := policy.Outcome{Status: 200, InputTokens: 1000, OutputTokens: 100}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := chat("tenant", "chat", 1000, 256)
			for pb.Next() {
				d, _ := l.Admit(context.Background(), r)
				d.Done(out)
			}
		})
	})
	b.Run("identify", func(b *testing.B) {
		k, err := KeyringOf(Tenant{Name: "a", Keys: []string{"sk-0123456789abcdef0123456789abcdef"}})
		if err != nil {
			b.Fatal(err)
		}
		h := map[string][]string{"Authorization": {"Bearer sk-0123456789abcdef0123456789abcdef"}}
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := k.Identify(h); !ok {
				b.Fatal("not identified")
			}
		}
	})
}
