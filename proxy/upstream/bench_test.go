package upstream

import (
	"fmt"
	"testing"
	"time"
)

func benchCluster(b *testing.B, n int) *Cluster {
	b.Helper()
	sp := specs(n)
	for i := range sp {
		sp[i].URL = fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250+1)
		sp[i].Weight = 1 + i%3
	}
	c := newTestCluster(b, Options{
		Endpoints:   sp,
		HealthCheck: HealthCheck{Interval: time.Hour},
		Outlier:     Outlier{ConsecutiveFailures: 5},
	})
	for i, e := range c.Endpoints() {
		for range i % 7 {
			e.Begin()
		}
	}
	return c
}

// BenchmarkPick64 measures one Pick over 64 endpoints with mixed weights and loads.
func BenchmarkPick64(b *testing.B) {
	c := benchCluster(b, 64)
	ex := c.Endpoints()[3]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Pick(ex); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPick64Parallel is Pick plus Begin/End from all Ps at once, as under load.
func BenchmarkPick64Parallel(b *testing.B) {
	c := benchCluster(b, 64)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e, err := c.Pick(nil)
			if err != nil {
				b.Error(err)
				return
			}
			e.Begin()
			e.End()
		}
	})
}
