package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicegw/sluice/test/sim"
)

// simURL starts a simulator on a 127.0.0.1 ephemeral port.
func simURL(t *testing.T, cfg sim.Config) string {
	t.Helper()
	s := sim.New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); s.Close() })
	return ts.URL
}

// failingURL starts a server that answers every request 500, the first three through upstream
// "default" and the others through "fallback" (x-sluice-upstream).
func failingURL(t *testing.T) string {
	t.Helper()
	var n atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := "default"
		if n.Add(1) > 3 {
			up = "fallback"
		}
		w.Header().Set("X-Sluice-Upstream", up)
		http.Error(w, `{"error":{"message":"upstream down"}}`, http.StatusInternalServerError)
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// TestLoadExitStatus: a run in which every request failed, or whose SLO attainment is below
// --slo-attainment, exits 1 with one line on stderr saying why, after its summary and JSON;
// a bad --target is a usage error naming the fix; `load merge` only combines.
func TestLoadExitStatus(t *testing.T) {
	failing := failingURL(t)
	slow := simURL(t, sim.Config{TTFT: 40 * time.Millisecond, Seed: 1}) // far above the tight SLO below
	fast := simURL(t, sim.Config{Seed: 1})
	dir := t.TempDir()
	failedJSON := filepath.Join(dir, "failed.json")
	work := []string{"--synthetic", "in=fixed:16,out=fixed:4", "--requests", "4", "--concurrency", "2", "--quiet"}
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string // substrings of stdout
		stderr string   // substring of stderr ("" for none expected)
	}{
		{name: "every request failed", args: append([]string{"--target", failing, "--json", failedJSON}, work...), code: 1,
			stdout: []string{"requests 4  ok 0  failed 4", "errors: http_5xx 4", "upstreams: default 3, fallback 1"},
			stderr: "sluice load: every request failed (4 of 4: http_5xx 4)\n"},
		{name: "every request failed, with --slo-attainment 0", args: append([]string{"--target", failing, "--slo", "ttft=1s", "--slo-attainment", "0"}, work...),
			code: 1, stderr: "sluice load: every request failed (4 of 4: http_5xx 4)\n"},
		{name: "SLO missed", args: append([]string{"--target", slow, "--slo", "ttft=5ms,e2e=1m"}, work...), code: 1,
			stdout: []string{"requests 4  ok 4  failed 0", "attainment all 0.0%"},
			stderr: "sluice load: SLO missed: attainment 0.0% < 90.0% (ttft 0.0%, e2e 100.0%; 0 of 4 requests met every limit)\n"},
		{name: "SLO missed, own threshold", args: append([]string{"--target", slow, "--slo", "ttft=5ms", "--slo-attainment", "0.5"}, work...),
			code: 1, stderr: "sluice load: SLO missed: attainment 0.0% < 50.0% (ttft 0.0%;"},
		{name: "SLO missed, attainment 0 never fails", args: append([]string{"--target", slow, "--slo", "ttft=5ms", "--slo-attainment", "0"}, work...),
			code: 0, stdout: []string{"attainment all 0.0%"}},
		{name: "SLO met", args: append([]string{"--target", fast, "--slo", "ttft=30s"}, work...), code: 0,
			stdout: []string{"requests 4  ok 4  failed 0", "attainment all 100.0%"}},
		{name: "no SLO", args: append([]string{"--target", slow}, work...), code: 0, stdout: []string{"ok 4"}},
		{name: "sweep where no step passes", args: []string{"--target", slow, "--synthetic", "in=fixed:16,out=fixed:4", "--sweep",
			"--rate", "200", "--sweep-steps", "2", "--requests", "2", "--slo", "ttft=5ms", "--quiet"}, code: 1,
			stdout: []string{"sweep: rate   200.00 req/s  attainment   0.0%"},
			stderr: "sluice load: SLO missed at every rate of the sweep (2 steps): best attainment 0.0% < 90.0%, at 200.00 req/s\n"},
		{name: "target without a scheme", args: append([]string{"--target", "127.0.0.1:8080"}, work...), code: 1,
			stderr: "sluice load: --target 127.0.0.1:8080 has no scheme: use http://127.0.0.1:8080\n"},
		{name: "target with a host as the scheme", args: append([]string{"--target", "localhost:8080"}, work...), code: 1,
			stderr: "--target localhost:8080 has no scheme: use http://localhost:8080"},
		{name: "target without a host", args: append([]string{"--target", "http://:8080"}, work...), code: 1,
			stderr: "--target http://:8080 has no host"},
		{name: "target of another scheme", args: append([]string{"--target", "grpc://127.0.0.1:8080"}, work...), code: 1,
			stderr: `--target grpc://127.0.0.1:8080: scheme "grpc", want http or https`},
		{name: "attainment out of range", args: append([]string{"--target", fast, "--slo", "ttft=1s", "--slo-attainment", "90"}, work...), code: 1,
			stderr: "--slo-attainment 90: want a share in [0, 1]"},
		{name: "attainment without an SLO", args: append([]string{"--target", fast, "--slo-attainment", "0.5"}, work...), code: 1,
			stderr: "--slo-attainment needs --slo"},
		{name: "attainment with a sweep", args: []string{"--target", fast, "--synthetic", "in=fixed:16,out=fixed:4", "--sweep", "--requests", "2",
			"--slo", "ttft=1s", "--slo-attainment", "0.5"}, code: 1, stderr: "with --sweep give --sweep-attainment"},
		{name: "sweep attainment out of range", args: append([]string{"--target", fast, "--sweep-attainment", "0"}, work...), code: 1,
			stderr: "--sweep-attainment 0: want a share in (0, 1]"},
		// After "every request failed" wrote it: merging only combines, whatever the SLO or errors.
		{name: "merge does not judge", args: []string{"merge", failedJSON}, code: 0, stdout: []string{"requests 4  ok 0  failed 4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(append([]string{"load"}, tt.args...), &out, &errb)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errb.String())
			}
			for _, want := range tt.stdout {
				if !strings.Contains(out.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, out.String())
				}
			}
			if tt.stderr != "" && !strings.Contains(errb.String(), tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, errb.String())
			}
			if tt.code == 0 && errb.Len() > 0 {
				t.Errorf("stderr of a passing run: %s", errb.String())
			}
		})
	}
}

// screen is one terminal that stdout and stderr both write to.
type screen struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLoadSummaryOnItsOwnLine: with the live progress view drawn, the summary's first line
// and each sweep line start on a line of their own, not after the progress line.
func TestLoadSummaryOnItsOwnLine(t *testing.T) {
	show := showProgress
	showProgress = func(bool, io.Writer) bool { return true }
	t.Cleanup(func() { showProgress = show })
	url := simURL(t, sim.Config{Seed: 1})
	tests := []struct {
		name  string
		args  []string
		lines []string // each must start a line, as often as it occurs
	}{
		{"run", []string{"--requests", "3", "--concurrency", "1"}, []string{"target "}},
		{"run with a known total", []string{"--requests", "3", "--rate", "500"}, []string{"target "}},
		{"run of unknown length", []string{"--duration", "50ms", "--rate", "100"}, []string{"target "}},
		{"sweep", []string{"--sweep", "--rate", "500", "--sweep-steps", "2", "--requests", "2", "--slo", "ttft=30s"},
			[]string{"sweep: rate", "target "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s screen
			args := append([]string{"load", "--target", url, "--synthetic", "in=fixed:16,out=fixed:2"}, tt.args...)
			if code := run(args, &s, &s); code != 0 {
				t.Fatalf("exit %d\n%s", code, s.String())
			}
			text := s.String()
			if !strings.Contains(text, "req/s  in-flight") {
				t.Fatalf("no progress view drawn:\n%q", text)
			}
			for _, l := range tt.lines {
				n := 0
				for i := 0; i < len(text); {
					j := strings.Index(text[i:], l)
					if j < 0 {
						break
					}
					at := i + j
					if at > 0 && text[at-1] != '\n' {
						t.Errorf("%q does not start a line: ...%q", l, text[max(at-60, 0):at+len(l)])
					}
					n++
					i = at + len(l)
				}
				if n == 0 {
					t.Errorf("output lacks %q:\n%q", l, text)
				}
			}
			if !strings.HasSuffix(text, "\n") {
				t.Errorf("output does not end its last line: %q", text[max(len(text)-60, 0):])
			}
		})
	}
}
