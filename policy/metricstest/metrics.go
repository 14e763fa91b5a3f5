// Package metricstest reads what a policy.MetricsReporter emits and checks it against the
// contract the gateway's exporter relies on: Prometheus names of the policy's own
// (sluice_…), counters and only counters ending in _total, a help text, one kind, help and
// set of label names per name, none of the labels the gateway adds (route, policy), and
// histograms whose bounds ascend and whose counts add up.
package metricstest

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/policy"
)

var (
	metricName = regexp.MustCompile(`^sluice_[a-zA-Z0-9_]+$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// Collect calls r.ReportMetrics once and returns its samples by key: the name, then the
// labels in the order emitted, as `name{k="v",k2="v2"}` (the bare name for a sample without
// labels). It fails t for each sample that breaks the contract, and for a key emitted twice.
func Collect(t testing.TB, r policy.MetricsReporter) map[string]policy.Sample {
	t.Helper()
	out := map[string]policy.Sample{}
	first := map[string]policy.Sample{} // the first sample of each name
	r.ReportMetrics(func(s policy.Sample) {
		k := Key(s.Name, s.Labels...)
		if err := check(s, first); err != nil {
			t.Errorf("sample %s: %v", k, err)
		}
		if _, dup := out[k]; dup {
			t.Errorf("sample %s emitted twice", k)
		}
		out[k] = s
	})
	return out
}

// Expect fails t unless m (what Collect returned) holds a sample of each key of want with
// its value, a sample of each key of others (those whose values another check reads: a
// histogram's), and no other sample.
func Expect(t testing.TB, m map[string]policy.Sample, want map[string]float64, others ...string) {
	t.Helper()
	for k, v := range want {
		if s, ok := m[k]; !ok || s.Value != v {
			t.Errorf("%s = %v (reported: %t), want %v", k, s.Value, ok, v)
		}
	}
	for _, k := range others {
		if _, ok := m[k]; !ok {
			t.Errorf("%s not reported", k)
		}
	}
	for k := range m {
		if _, ok := want[k]; !ok && !slices.Contains(others, k) {
			t.Errorf("%s reported, not expected", k)
		}
	}
}

// Key is the key Collect files a sample under.
func Key(name string, labels ...[2]string) string {
	if len(labels) == 0 {
		return name
	}
	parts := make([]string, len(labels))
	for i, l := range labels {
		parts[i] = fmt.Sprintf("%s=%q", l[0], l[1])
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

func check(s policy.Sample, first map[string]policy.Sample) error {
	if !metricName.MatchString(s.Name) {
		return fmt.Errorf("name %q is not a Prometheus name starting with sluice_", s.Name)
	}
	if s.Help == "" {
		return fmt.Errorf("no help text")
	}
	if total := strings.HasSuffix(s.Name, "_total"); total != (s.Kind == policy.Counter) {
		return fmt.Errorf("kind %d: counters, and only counters, end in _total", s.Kind)
	}
	for _, l := range s.Labels {
		switch {
		case !labelName.MatchString(l[0]) || strings.HasPrefix(l[0], "__"):
			return fmt.Errorf("label name %q is not a Prometheus label name", l[0])
		case l[0] == "route" || l[0] == "policy":
			return fmt.Errorf("label %q is the gateway's to add", l[0])
		case l[0] == "le" && s.Kind == policy.Histogram:
			return fmt.Errorf("label le is a histogram's bucket label")
		}
	}
	if f, ok := first[s.Name]; !ok {
		first[s.Name] = s
	} else if f.Kind != s.Kind || f.Help != s.Help || !slices.Equal(labelNames(f), labelNames(s)) {
		return fmt.Errorf("kind, help or label names differ from the first sample of %s (%d %q %v)", s.Name, f.Kind, f.Help, labelNames(f))
	}
	switch s.Kind {
	case policy.Counter:
		if s.Value < 0 || math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			return fmt.Errorf("counter value %v", s.Value)
		}
	case policy.Gauge:
		if math.IsNaN(s.Value) {
			return fmt.Errorf("gauge value NaN")
		}
	case policy.Histogram:
		for i := 1; i < len(s.Bounds); i++ {
			if !(s.Bounds[i-1] < s.Bounds[i]) {
				return fmt.Errorf("bounds %v do not ascend", s.Bounds)
			}
		}
		if len(s.Counts) > len(s.Bounds)+1 {
			return fmt.Errorf("%d counts for %d bounds", len(s.Counts), len(s.Bounds))
		}
		var sum uint64
		for _, c := range s.Counts {
			sum += c
		}
		if sum > s.Count || len(s.Counts) == len(s.Bounds)+1 && sum != s.Count {
			return fmt.Errorf("counts add up to %d, count %d", sum, s.Count)
		}
	default:
		return fmt.Errorf("unknown kind %d", s.Kind)
	}
	return nil
}

func labelNames(s policy.Sample) []string {
	out := make([]string, len(s.Labels))
	for i, l := range s.Labels {
		out[i] = l[0]
	}
	return out
}
