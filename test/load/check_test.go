package load

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// finished returns a request that has ended (unit_test.go's result): ok with the given TTFT
// and two tokens 1 ms apart, or failed with class.
func finished(ttft time.Duration, class string) *Result {
	if class != ErrNone {
		return result(1, time.Now(), 0, 0, 0, class)
	}
	return result(1, time.Now(), ttft, time.Millisecond, 2, class)
}

// TestReportCheck: a run where every request failed, or whose SLO attainment is below the
// threshold, is an error that says why; the others pass.
func TestReportCheck(t *testing.T) {
	slo := SLO{TTFT: 100 * time.Millisecond}
	fast, slow := 10*time.Millisecond, 500*time.Millisecond
	tests := []struct {
		name    string
		slo     SLO
		results []*Result
		aborted int
		min     float64
		sweep   []SweepStep
		is      error  // nil: passes
		msg     string // the whole message, when is != nil
	}{
		{name: "every request failed", results: []*Result{finished(0, ErrHTTP5xx), finished(0, ErrHTTP5xx), finished(0, ErrTimeout)},
			min: 0.9, is: ErrAllFailed, msg: "every request failed (3 of 3: http_5xx 2, timeout 1)"},
		{name: "every request failed, with an SLO", slo: slo, results: []*Result{finished(0, ErrHTTP5xx)},
			min: 0, is: ErrAllFailed, msg: "every request failed (1 of 1: http_5xx 1)"},
		{name: "one ok of many", results: []*Result{finished(fast, ErrNone), finished(0, ErrHTTP5xx), finished(0, ErrHTTP5xx)}, min: 0.9},
		{name: "no SLO", results: []*Result{finished(slow, ErrNone)}, min: 0.9},
		{name: "SLO met", slo: slo, results: []*Result{finished(fast, ErrNone), finished(fast, ErrNone)}, min: 0.9},
		{name: "SLO met at the threshold", slo: slo,
			results: []*Result{finished(fast, ErrNone), finished(fast, ErrNone), finished(fast, ErrNone), finished(slow, ErrNone)}, min: 0.75},
		{name: "SLO missed", slo: SLO{TTFT: 100 * time.Millisecond, ITL: time.Second},
			results: []*Result{finished(fast, ErrNone), finished(slow, ErrNone), finished(slow, ErrNone), finished(0, ErrConnect)}, min: 0.9,
			is: ErrSLOMissed, msg: "SLO missed: attainment 25.0% < 90.0% (ttft 25.0%, itl 75.0%; 1 of 4 requests met every limit)"},
		{name: "SLO missed, attainment 0 disables", slo: slo, results: []*Result{finished(slow, ErrNone)}, min: 0},
		{name: "SLO missed by a hair", slo: slo, results: append(repeat(finished(fast, ErrNone), 8996), repeat(finished(slow, ErrNone), 1004)...),
			min: 0.9, is: ErrSLOMissed, msg: "SLO missed: attainment 89.96% < 90.00% (ttft 89.96%; 8996 of 10000 requests met every limit)"},
		{name: "only aborted", results: nil, aborted: 3, min: 0.9},
		{name: "nothing sent", min: 0.9},
		{name: "sweep with a passing step", slo: slo, results: []*Result{finished(fast, ErrNone)}, min: 0.9,
			sweep: []SweepStep{{Rate: 1, Attainment: 1, Pass: true}, {Rate: 2, Attainment: 0.5}}},
		{name: "sweep without one", slo: slo, results: []*Result{finished(slow, ErrNone)}, min: 0.9, is: ErrSLOMissed,
			sweep: []SweepStep{{Rate: 1, Attainment: 0.8}, {Rate: 0.5, Attainment: 0.85}}, msg: "SLO missed at every rate of the sweep (2 steps): best attainment 85.0% < 90.0%, at 0.50 req/s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCollector(tt.slo)
			for _, r := range tt.results {
				c.Add(r)
			}
			for range tt.aborted {
				r := finished(fast, ErrNone)
				r.Aborted = true
				c.Add(r)
			}
			rep := c.Report()
			rep.Sweep = tt.sweep
			err := rep.Check(tt.min)
			if tt.is == nil {
				if err != nil {
					t.Fatalf("Check(%g) = %v, want nil", tt.min, err)
				}
				return
			}
			if !errors.Is(err, tt.is) || err.Error() != tt.msg {
				t.Fatalf("Check(%g) = %v\nwant %q (%v)", tt.min, err, tt.msg, tt.is)
			}
		})
	}
}

func repeat(r *Result, n int) []*Result {
	out := make([]*Result, n)
	for i := range out {
		out[i] = r
	}
	return out
}

// TestCheckTarget: a target needs an http or https scheme and a host; the error for one without
// a scheme suggests the fix, and Run refuses it before sending anything.
func TestCheckTarget(t *testing.T) {
	tests := []struct {
		target string
		err    string // "" when valid
	}{
		{"http://127.0.0.1:8080", ""},
		{"https://api.example.com/v1", ""},
		{"http://127.0.0.1:8080/v1/chat/completions", ""},
		{"HTTP://127.0.0.1:8080", ""},
		{"http://[::1]:8080", ""},
		{"127.0.0.1:8080", "--target 127.0.0.1:8080 has no scheme: use http://127.0.0.1:8080"},
		{"localhost:8080", "--target localhost:8080 has no scheme: use http://localhost:8080"},
		{"localhost", "--target localhost has no scheme: use http://localhost"},
		{"api.example.com/v1", "--target api.example.com/v1 has no scheme: use http://api.example.com/v1"},
		{"http://", "--target http:// has no host: want http://HOST:PORT, e.g. http://127.0.0.1:8080"},
		{"http://:8080", "--target http://:8080 has no host"},
		{"http:/v1", "--target http:/v1 has no host"},
		{"ftp://127.0.0.1:21", `--target ftp://127.0.0.1:21: scheme "ftp", want http or https`},
		{"ws://127.0.0.1:8080", `scheme "ws", want http or https`},
		{"unix:///run/vllm.sock", `scheme "unix", want http or https`},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			err := CheckTarget(tt.target)
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("CheckTarget(%q) = %v, want nil", tt.target, err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("CheckTarget(%q) = %v, want %q", tt.target, err, tt.err)
			}
		})
	}
	t.Run("Run", func(t *testing.T) {
		sp, err := ParseSynthetic("in=fixed:8,out=fixed:2")
		if err != nil {
			t.Fatal(err)
		}
		// Nothing listens there: a request sent would fail as a connect error, not as this.
		r, err := Run(context.Background(), Config{Target: "127.0.0.1:1", Workload: &Workload{Synthetic: sp}, Concurrency: 1, Requests: 1})
		if r != nil || err == nil || !strings.Contains(err.Error(), "has no scheme: use http://127.0.0.1:1") {
			t.Fatalf("Run = %v, %v; want no report and the scheme error", r, err)
		}
	})
}

// TestSummaryPrintsCountsSorted: the text summary and the HTML report print counts by name as
// "name count" lists, the largest first (ties by name), never as Go maps or slices.
func TestSummaryPrintsCountsSorted(t *testing.T) {
	c := NewCollector(SLO{})
	for i := range 12 {
		r := finished(time.Millisecond, ErrNone)
		switch {
		case i < 7:
			r.Upstream = "default"
		case i < 9:
			r.Upstream = "fallback"
		case i < 11:
			r.Upstream = "b-pool"
			r.Class, r.Status = ErrHTTP5xx, 503
		default:
			r.Upstream = "b-pool"
			r.Class, r.Status = ErrTimeout, 0
		}
		c.Add(r)
	}
	rep := c.Report()
	rep.Meta.Shards = []string{"0/2", "1/2"}
	var out bytes.Buffer
	PrintSummary(&out, rep)
	text := out.String()
	for _, want := range []string{
		"\nupstreams: default 7, b-pool 3, fallback 2\n",
		"\nerrors: http_5xx 2, timeout 1\n",
		"\nshards 0/2, 1/2\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("summary lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "map[") || strings.Contains(text, "[0/2") {
		t.Errorf("summary prints a Go map or slice:\n%s", text)
	}
	out.Reset()
	if err := rep.WriteHTML(&out); err != nil {
		t.Fatal(err)
	}
	html := out.String()
	if !strings.Contains(html, "merged shards 0/2, 1/2") || strings.Contains(html, "[0/2") || strings.Contains(html, "map[") {
		t.Errorf("HTML prints a Go map or slice")
	}
	i, j, k := strings.Index(html, "<td>default</td>"), strings.Index(html, "<td>b-pool</td>"), strings.Index(html, "<td>fallback</td>")
	if i < 0 || !(i < j && j < k) {
		t.Errorf("HTML upstreams not largest first: default %d, b-pool %d, fallback %d", i, j, k)
	}
}
