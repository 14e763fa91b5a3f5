package concurrency

import (
	"context"
	"testing"

	"github.com/sluicegw/sluice/policy"
)

func BenchmarkAdmitDone(b *testing.B) {
	l, err := New(Params{}, policy.Env{Route: "chat", Clock: policy.SystemClock{}})
	if err != nil {
		b.Fatal(err)
	}
	r := req("t")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, _ := l.Admit(ctx, r)
		d.Done(ok200)
	}
}

func BenchmarkAdmitDoneParallel(b *testing.B) {
	l, err := New(Params{MaxLimit: 1 << 20, InitialLimit: 1 << 20, Adaptive: ptr(false)}, policy.Env{Route: "chat", Clock: policy.SystemClock{}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := req("t")
		ctx := context.Background()
		for pb.Next() {
			d, _ := l.Admit(ctx, r)
			d.Done(ok200)
		}
	})
}
