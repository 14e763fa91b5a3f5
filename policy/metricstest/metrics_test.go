package metricstest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/policy"
)

// reporter emits its samples.
type reporter []policy.Sample

func (r reporter) ReportMetrics(emit func(policy.Sample)) {
	for _, s := range r {
		emit(s)
	}
}

// recorder is a testing.TB that records the errors instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestCollect(t *testing.T) {
	counter := policy.Sample{Name: "sluice_x_total", Help: "x", Kind: policy.Counter, Value: 2, Labels: [][2]string{{"code", "a"}}}
	gauge := policy.Sample{Name: "sluice_x_level", Help: "level", Kind: policy.Gauge, Value: -1}
	hist := policy.Sample{Name: "sluice_x_seconds", Help: "s", Kind: policy.Histogram,
		Bounds: []float64{0, 1}, Counts: []uint64{1, 2, 3}, Count: 6, Sum: 9}
	with := func(s policy.Sample, f func(*policy.Sample)) policy.Sample {
		s.Labels = append([][2]string(nil), s.Labels...)
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name    string
		samples []policy.Sample
		want    string // a part of the error; "" none
	}{
		{"good", []policy.Sample{counter, with(counter, func(s *policy.Sample) { s.Labels[0][1] = "b" }), gauge, hist}, ""},
		{"counts without +Inf", []policy.Sample{with(hist, func(s *policy.Sample) { s.Counts = s.Counts[:2] })}, ""},
		{"not ours", []policy.Sample{with(gauge, func(s *policy.Sample) { s.Name = "process_x" })}, "Prometheus name"},
		{"no help", []policy.Sample{with(gauge, func(s *policy.Sample) { s.Help = "" })}, "no help"},
		{"counter without _total", []policy.Sample{with(counter, func(s *policy.Sample) { s.Name = "sluice_x" })}, "end in _total"},
		{"gauge with _total", []policy.Sample{with(gauge, func(s *policy.Sample) { s.Name = "sluice_x_total" })}, "end in _total"},
		{"route label", []policy.Sample{with(counter, func(s *policy.Sample) { s.Labels[0][0] = "route" })}, "gateway's"},
		{"policy label", []policy.Sample{with(counter, func(s *policy.Sample) { s.Labels[0][0] = "policy" })}, "gateway's"},
		{"bad label", []policy.Sample{with(counter, func(s *policy.Sample) { s.Labels[0][0] = "a-b" })}, "label name"},
		{"le on a histogram", []policy.Sample{with(hist, func(s *policy.Sample) { s.Labels = [][2]string{{"le", "1"}} })}, "bucket label"},
		{"label names differ", []policy.Sample{counter, with(counter, func(s *policy.Sample) { s.Labels = [][2]string{{"reason", "a"}} })}, "differ"},
		{"help differs", []policy.Sample{counter, with(counter, func(s *policy.Sample) { s.Help, s.Labels[0][1] = "other", "b" })}, "differ"},
		{"twice", []policy.Sample{counter, counter}, "twice"},
		{"negative counter", []policy.Sample{with(counter, func(s *policy.Sample) { s.Value = -1 })}, "counter value"},
		{"bounds descend", []policy.Sample{with(hist, func(s *policy.Sample) { s.Bounds = []float64{1, 0} })}, "ascend"},
		{"counts do not add up", []policy.Sample{with(hist, func(s *policy.Sample) { s.Count = 5 })}, "add up"},
		{"too many counts", []policy.Sample{with(hist, func(s *policy.Sample) { s.Counts = []uint64{1, 1, 1, 1}; s.Count = 4 })}, "counts for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			got := Collect(rec, reporter(tc.samples))
			errs := strings.Join(rec.errs, "; ")
			switch {
			case tc.want == "" && errs != "":
				t.Errorf("errors %s", errs)
			case tc.want != "" && !strings.Contains(errs, tc.want):
				t.Errorf("errors %q, want one with %q", errs, tc.want)
			}
			if tc.want == "" && len(got) != len(tc.samples) {
				t.Errorf("collected %d samples of %d: %v", len(got), len(tc.samples), got)
			}
		})
	}
	if k := Key("sluice_x_total", [2]string{"code", "a"}, [2]string{"tenant", `q"t`}); k != `sluice_x_total{code="a",tenant="q\"t"}` {
		t.Errorf("Key = %s", k)
	}
}

func TestExpect(t *testing.T) {
	m := map[string]policy.Sample{
		"sluice_x_level":   {Value: 1},
		"sluice_x_seconds": {Kind: policy.Histogram, Count: 3},
	}
	for _, tc := range []struct {
		name   string
		want   map[string]float64
		others []string
		err    string // a part of the error; "" none
	}{
		{"all", map[string]float64{"sluice_x_level": 1}, []string{"sluice_x_seconds"}, ""},
		{"wrong value", map[string]float64{"sluice_x_level": 2}, []string{"sluice_x_seconds"}, "sluice_x_level = 1 (reported: true), want 2"},
		{"missing", map[string]float64{"sluice_x_level": 1, "sluice_x_total": 0}, []string{"sluice_x_seconds"}, "sluice_x_total = 0 (reported: false)"},
		{"missing other", map[string]float64{"sluice_x_level": 1}, []string{"sluice_x_seconds", "sluice_y_seconds"}, "sluice_y_seconds not reported"},
		{"not expected", map[string]float64{"sluice_x_level": 1}, nil, "sluice_x_seconds reported, not expected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			Expect(rec, m, tc.want, tc.others...)
			errs := strings.Join(rec.errs, "; ")
			switch {
			case tc.err == "" && errs != "":
				t.Errorf("errors %s", errs)
			case tc.err != "" && !strings.Contains(errs, tc.err):
				t.Errorf("errors %q, want one with %q", errs, tc.err)
			}
		})
	}
}
