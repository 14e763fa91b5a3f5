package upstream

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

func benchCluster(b *testing.B, n int) *Cluster {
	b.Helper()
	return benchClusterWith(b, n, nil)
}

func benchClusterWith(b *testing.B, n int, load LoadSource) *Cluster {
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
		Load:        load,
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

// snapshotLoad is a LoadSource as package gpu's scraper should be read: an immutable map
// behind an atomic pointer (here never replaced), the freshness check against a time.
type snapshotLoad struct {
	m   map[string]fakeSignal
	now func() time.Time
}

func (s *snapshotLoad) Get(url string) (Load, bool) {
	sig, ok := s.m[url]
	if !ok || s.now().Sub(sig.at) > 2*time.Second {
		return Load{}, false
	}
	return sig.l, true
}

// BenchmarkPickFor64 measures one PickFor over 64 endpoints with mixed weights and loads and
// fresh signals for every endpoint, without and with a prefix hash, against two sources:
// an RWMutex-guarded map (fakeLoad, as a straightforward scraper) and a lock-free snapshot.
// Both call time.Now per Get for freshness. p50-ns and p99-ns are of individually timed
// calls (every 8th), so they include about 40 ns of timer overhead.
func BenchmarkPickFor64(b *testing.B) {
	for _, source := range []string{"rwmutex", "snapshot"} {
		for _, hint := range []Hint{{}, {PrefixHash: 0x9e3779b97f4a7c15}} {
			name := "source=" + source + "/prefix=" + map[bool]string{false: "none", true: "hash"}[hint.PrefixHash != 0]
			b.Run(name, func(b *testing.B) {
				now := time.Now()
				sigs := map[string]fakeSignal{}
				for i := range 64 {
					sigs[fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250+1)] = fakeSignal{
						l: Load{Waiting: float64(i % 5), Running: 8, KVCacheUsage: float64(i%10) / 10}, at: now}
				}
				var src LoadSource
				if source == "rwmutex" {
					f := newFakeLoad(realClock{})
					f.sigs = sigs
					src = f
				} else {
					src = &snapshotLoad{m: sigs, now: time.Now}
				}
				c := benchClusterWith(b, 64, src)
				ex := c.Endpoints()[3]
				samples := make([]time.Duration, 0, 1<<16)
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if i%8 == 0 && len(samples) < cap(samples) {
						t0 := time.Now()
						_, err := c.PickFor(ex, hint)
						samples = append(samples, time.Since(t0))
						if err != nil {
							b.Fatal(err)
						}
						continue
					}
					if _, err := c.PickFor(ex, hint); err != nil {
						b.Fatal(err)
					}
				}
				if len(samples) > 0 {
					slices.Sort(samples)
					b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "p50-ns")
					b.ReportMetric(float64(samples[len(samples)*99/100].Nanoseconds()), "p99-ns")
				}
			})
		}
	}
}

// BenchmarkPickFor64Parallel is PickFor (snapshot source, prefix hash) plus Begin/End from
// all Ps at once, as under load.
func BenchmarkPickFor64Parallel(b *testing.B) {
	now := time.Now()
	sigs := map[string]fakeSignal{}
	for i := range 64 {
		sigs[fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250+1)] = fakeSignal{l: Load{Waiting: float64(i % 5)}, at: now}
	}
	c := benchClusterWith(b, 64, &snapshotLoad{m: sigs, now: time.Now})
	var n atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		h := Hint{PrefixHash: n.Add(1) * 0x9e3779b97f4a7c15}
		for pb.Next() {
			e, err := c.PickFor(nil, h)
			if err != nil {
				b.Error(err)
				return
			}
			e.Begin()
			e.End()
		}
	})
}
