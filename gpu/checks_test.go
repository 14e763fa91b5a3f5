package gpu

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A trace (testdata/checks/*.trace) is a model server's metrics over time, written as
// segments, and what the checks must make of it:
//
//	# every: 1s                          scrape interval (default 250ms)
//	# checks: stall.window=10s ...       overrides of the default Checks
//	# has: waiting,running,kv,throughput metrics the page reports (default all)
//	# expect: none                       never flagged
//	# expect: stall 40s..60s             first flagged within [40s, 60s] of the trace
//	# clear: stall 90s..100s             that flag clears within [90s, 100s]
//	# never: kv_leak                     that check is never flagged
//	60s waiting=0 running=4 kv=0.5 rate=800
//	30s waiting=0..20 running=8 kv=0.6 rate=800..0
//	reset                                the throughput counter starts again from 0
//
// A segment lasts its duration; a..b ramps linearly over it; rate is throughput per second,
// integrated into the counter. Scrapes fall every `every` from 0.
type trace struct {
	name    string
	every   time.Duration
	checks  Checks
	has     uint8
	expect  map[string][2]time.Duration // check → first flagged within
	clear   map[string][2]time.Duration
	never   map[string]bool
	none    bool
	samples []traceSample
}

type traceSample struct {
	at    time.Duration
	l     Load
	reset bool
}

type ramp struct{ from, to float64 }

func (r ramp) at(f float64) float64 { return r.from + (r.to-r.from)*f }

func parseRamp(v string) (ramp, error) {
	a, b, ok := strings.Cut(v, "..")
	x, err := strconv.ParseFloat(a, 64)
	if err != nil {
		return ramp{}, err
	}
	if !ok {
		return ramp{x, x}, nil
	}
	y, err := strconv.ParseFloat(b, 64)
	return ramp{x, y}, err
}

func parseWindow(v string) ([2]time.Duration, error) {
	a, b, ok := strings.Cut(v, "..")
	if !ok {
		return [2]time.Duration{}, fmt.Errorf("want FROM..TO, got %q", v)
	}
	x, err := time.ParseDuration(a)
	if err != nil {
		return [2]time.Duration{}, err
	}
	y, err := time.ParseDuration(b)
	return [2]time.Duration{x, y}, err
}

func applyCheck(c *Checks, kv string) error {
	k, v, ok := strings.Cut(kv, "=")
	if !ok {
		return fmt.Errorf("want key=value, got %q", kv)
	}
	dur := func(dst *time.Duration) error {
		d, err := time.ParseDuration(v)
		*dst = d
		return err
	}
	num := func(dst *float64) error {
		f, err := strconv.ParseFloat(v, 64)
		*dst = f
		return err
	}
	switch k {
	case "leak.for":
		return dur(&c.Leak.For)
	case "leak.min_kv_usage":
		return num(&c.Leak.MinKVUsage)
	case "leak.clear_below":
		return num(&c.Leak.ClearBelow)
	case "stall.window":
		return dur(&c.Stall.Window)
	case "stall.min_waiting":
		return num(&c.Stall.MinWaiting)
	case "stall.max_throughput_ratio":
		return num(&c.Stall.MaxThroughputRatio)
	}
	return fmt.Errorf("unknown check setting %q", k)
}

func loadTrace(t *testing.T, path string) trace {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tr := trace{name: filepath.Base(path), every: 250 * time.Millisecond, has: hasWaiting | hasRunning | hasKV | hasThroughput,
		expect: map[string][2]time.Duration{}, clear: map[string][2]time.Duration{}, never: map[string]bool{}}
	type segment struct {
		d                          time.Duration
		waiting, running, kv, rate ramp
		reset                      bool
	}
	var segs []segment
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		fail := func(err error) { t.Fatalf("%s:%d: %v", path, n, err) }
		if line == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "#"); ok {
			key, val, _ := strings.Cut(strings.TrimSpace(rest), ":")
			fields := strings.Fields(val)
			switch key {
			case "every":
				if tr.every, err = time.ParseDuration(strings.TrimSpace(val)); err != nil {
					fail(err)
				}
			case "checks":
				for _, kv := range fields {
					if err := applyCheck(&tr.checks, kv); err != nil {
						fail(err)
					}
				}
			case "has":
				tr.has = 0
				for _, h := range strings.Split(strings.TrimSpace(val), ",") {
					bit := map[string]uint8{"waiting": hasWaiting, "running": hasRunning, "kv": hasKV, "throughput": hasThroughput}[h]
					if bit == 0 {
						fail(fmt.Errorf("unknown metric %q", h))
					}
					tr.has |= bit
				}
			case "expect", "clear":
				if key == "expect" && len(fields) == 1 && fields[0] == "none" {
					tr.none = true
					continue
				}
				if len(fields) != 2 {
					fail(fmt.Errorf("want CHECK FROM..TO"))
				}
				w, err := parseWindow(fields[1])
				if err != nil {
					fail(err)
				}
				map[string]map[string][2]time.Duration{"expect": tr.expect, "clear": tr.clear}[key][fields[0]] = w
			case "never":
				for _, f := range fields {
					tr.never[f] = true
				}
			}
			continue
		}
		if line == "reset" {
			segs = append(segs, segment{reset: true})
			continue
		}
		fields := strings.Fields(line)
		d, err := time.ParseDuration(fields[0])
		if err != nil {
			fail(err)
		}
		sg := segment{d: d}
		for _, f := range fields[1:] {
			k, v, _ := strings.Cut(f, "=")
			r, err := parseRamp(v)
			if err != nil {
				fail(err)
			}
			switch k {
			case "waiting":
				sg.waiting = r
			case "running":
				sg.running = r
			case "kv":
				sg.kv = r
			case "rate":
				sg.rate = r
			default:
				fail(fmt.Errorf("unknown field %q", k))
			}
		}
		segs = append(segs, sg)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// Scrapes every tr.every; the counter integrates the rate between scrapes.
	var now, segStart time.Duration
	var counter float64
	reset := false
	for _, sg := range segs {
		if sg.reset {
			counter, reset = 0, true
			continue
		}
		for ; now < segStart+sg.d; now += tr.every {
			f := float64(now-segStart) / float64(sg.d)
			counter += sg.rate.at(f) * tr.every.Seconds()
			tr.samples = append(tr.samples, traceSample{at: now, reset: reset, l: Load{
				Waiting: math.Round(sg.waiting.at(f)), Running: math.Round(sg.running.at(f)),
				KVCacheUsage: sg.kv.at(f), Throughput: math.Round(counter),
			}})
			reset = false
		}
		segStart += sg.d
	}
	if len(tr.samples) == 0 {
		t.Fatalf("%s: no samples", path)
	}
	if !tr.none && len(tr.expect) == 0 && len(tr.never) == 0 {
		t.Fatalf("%s: no expectation", path)
	}
	if err := tr.checks.Validate(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return tr
}

// TestChecksTraces runs every trace of testdata/checks through one endpoint's checks, and
// holds each flag to its window: planted leaks and stalls are flagged in time and cleared
// when they end, and ordinary traffic (idle, busy, bursts that queue and drain, overload
// with steady throughput, noise, restarts) is never flagged.
func TestChecksTraces(t *testing.T) {
	files, err := filepath.Glob("testdata/checks/*.trace")
	if err != nil || len(files) < 10 {
		t.Fatalf("traces: %v (%d files)", err, len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			tr := loadTrace(t, f)
			checks := tr.checks.withDefaults()
			var k checker
			start := time.Unix(1_700_000_000, 0)
			first := map[string]time.Duration{}
			cleared := map[string]time.Duration{}
			var prev Flags
			for _, s := range tr.samples {
				l := s.l
				flags, trs := k.observe(&checks, &l, tr.has, start.Add(s.at), nil)
				for _, x := range trs {
					if x.detail == "" {
						t.Errorf("%v: transition of %s without a detail", s.at, CheckNames[x.check])
					}
				}
				for i, name := range CheckNames {
					bit := Flags(1 << i)
					switch {
					case flags&bit != 0 && prev&bit == 0:
						if _, ok := first[name]; !ok {
							first[name] = s.at
						}
					case flags&bit == 0 && prev&bit != 0:
						if _, ok := cleared[name]; !ok {
							cleared[name] = s.at
						}
					}
				}
				prev = flags
			}
			for _, name := range CheckNames {
				got, flagged := first[name]
				want, expected := tr.expect[name]
				switch {
				case expected && !flagged:
					t.Errorf("%s never flagged, want within %v..%v", name, want[0], want[1])
				case expected && (got < want[0] || got > want[1]):
					t.Errorf("%s first flagged at %v, want within %v..%v", name, got, want[0], want[1])
				case !expected && flagged && (tr.none || tr.never[name]):
					t.Errorf("%s flagged at %v on ordinary traffic", name, got)
				case !expected && flagged:
					t.Errorf("%s flagged at %v, not expected", name, got)
				}
				if w, ok := tr.clear[name]; ok {
					c, ok := cleared[name]
					if !ok || c < w[0] || c > w[1] {
						t.Errorf("%s cleared at %v (cleared: %v), want within %v..%v", name, c, ok, w[0], w[1])
					}
				}
			}
		})
	}
}

func TestChecksValidate(t *testing.T) {
	tests := []struct {
		name string
		c    Checks
		want []string
	}{
		{"zero", Checks{}, nil},
		{"set", Checks{Leak: LeakCheck{MinKVUsage: 0.5, For: time.Minute, ClearBelow: 0.2},
			Stall: StallCheck{Window: time.Minute, MinWaiting: 10, MaxThroughputRatio: 0.25}}, nil},
		{"clear below the default min", Checks{Leak: LeakCheck{ClearBelow: 0.05}}, nil},
		{"all bad", Checks{Leak: LeakCheck{MinKVUsage: 1.5, For: -1, ClearBelow: -0.1},
			Stall: StallCheck{Window: -1, MinWaiting: math.NaN(), MaxThroughputRatio: 1}},
			[]string{"Leak.MinKVUsage", "Leak.For", "Leak.ClearBelow", "Stall.Window", "Stall.MinWaiting", "Stall.MaxThroughputRatio"}},
		{"clear above min", Checks{Leak: LeakCheck{MinKVUsage: 0.2, ClearBelow: 0.3}}, []string{"Leak.ClearBelow: 0.3 must be below MinKVUsage 0.2"}},
		{"clear above the default min", Checks{Leak: LeakCheck{ClearBelow: 0.1}}, []string{"Leak.ClearBelow: 0.1 must be below MinKVUsage 0.1"}},
		{"NaN", Checks{Leak: LeakCheck{MinKVUsage: math.NaN(), ClearBelow: math.NaN()}, Stall: StallCheck{MaxThroughputRatio: math.NaN()}},
			[]string{"Leak.MinKVUsage", "Leak.ClearBelow", "Stall.MaxThroughputRatio"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%v", w, err)
				}
			}
			if n := strings.Count(err.Error(), "\n") + 1; n != len(tc.want) {
				t.Errorf("%d problems, want %d:\n%v", n, len(tc.want), err)
			}
		})
	}
	if err := (&Scraper{Checks: Checks{Stall: StallCheck{Window: -1}}}).Start(t.Context()); err == nil || !strings.Contains(err.Error(), "Stall.Window") {
		t.Errorf("Start with bad checks: %v", err)
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		f    Flags
		s    string
		json string
	}{
		{0, "", "[]"},
		{FlagKVLeak, "kv_leak", `["kv_leak"]`},
		{FlagStall, "stall", `["stall"]`},
		{FlagKVLeak | FlagStall, "kv_leak,stall", `["kv_leak","stall"]`},
	} {
		b, err := json.Marshal(tc.f)
		if err != nil || string(b) != tc.json || tc.f.String() != tc.s {
			t.Errorf("%d: String %q, JSON %s (%v); want %q, %s", tc.f, tc.f.String(), b, err, tc.s, tc.json)
		}
	}
	for _, tc := range []struct {
		json string
		want Flags
		err  bool
	}{
		{`[]`, 0, false}, {`["stall"]`, FlagStall, false}, {`["stall","kv_leak"]`, FlagStall | FlagKVLeak, false},
		{`["leak"]`, 0, true}, {`"stall"`, 0, true},
	} {
		var f Flags
		if err := json.Unmarshal([]byte(tc.json), &f); (err != nil) != tc.err || f != tc.want {
			t.Errorf("Unmarshal(%s) = %v, %v", tc.json, f, err)
		}
	}
	if !(FlagKVLeak | FlagStall).Has(FlagStall) || FlagKVLeak.Has(FlagStall) {
		t.Error("Has")
	}
	b, _ := json.Marshal(Load{Flags: FlagStall})
	if !strings.Contains(string(b), `"flags":["stall"]`) {
		t.Errorf("Load JSON %s", b)
	}
	if b, _ := json.Marshal(Load{}); strings.Contains(string(b), "flags") {
		t.Errorf("Load without flags: %s", b)
	}
}

// TestHistoryBounded: the history stays at historySize samples whatever the scrape rate,
// spans at least the window once full, and merges fast scrapes into its newest slot.
func TestHistoryBounded(t *testing.T) {
	for _, every := range []time.Duration{time.Millisecond, 250 * time.Millisecond, 5 * time.Second, time.Minute} {
		var k checker
		const window = 30 * time.Second
		step := int64(window) / (historySize - 2)
		start := time.Unix(1_700_000_000, 0).UnixNano()
		for i := range max(10_000, int(3*window/every)) {
			k.push(sample{at: start + int64(i)*int64(every), waiting: float64(i % 7), minWaiting: float64(i % 7), throughput: float64(i)}, step)
		}
		if k.n != historySize {
			t.Fatalf("every %v: %d samples", every, k.n)
		}
		span := time.Duration(k.at(0).at - k.at(k.n-1).at)
		if span < window {
			t.Errorf("every %v: history spans %v < window %v", every, span, window)
		}
		for i := 1; i < k.n-1; i++ {
			if gap := k.at(i).at - k.at(i+1).at; gap < step {
				t.Errorf("every %v: kept samples %v apart, want >= %v", every, time.Duration(gap), time.Duration(step))
			}
		}
		if every < time.Second && k.at(1).minWaiting != 0 {
			t.Errorf("every %v: merged slot's least queue %v, want 0", every, k.at(1).minWaiting)
		}
	}
}

// TestCheckTransitionsLogged: entering and leaving a flag log one line each.
func TestCheckTransitionsLogged(t *testing.T) {
	var buf bytes.Buffer
	s := &Scraper{Logger: slog.New(slog.NewTextHandler(&buf, nil)), Checks: Checks{Leak: LeakCheck{For: time.Second}}}
	s.mu.Lock()
	if err := s.prepare(); err != nil {
		t.Fatal(err)
	}
	s.mu.Unlock()
	e := &endpoint{url: "http://a"}
	at := time.Unix(1_700_000_000, 0)
	for i, kv := range []float64{0.5, 0.5, 0.5, 0.5, 0} {
		l := Load{KVCacheUsage: kv, At: at.Add(time.Duration(i) * time.Second)}
		s.check(e, &l, hasWaiting|hasRunning|hasKV|hasThroughput)
		if want := i >= 1 && i < 4; l.Flags.Has(FlagKVLeak) != want {
			t.Errorf("scrape %d: flags %v", i, l.Flags)
		}
	}
	out := buf.String()
	if strings.Count(out, "gpu: endpoint flagged") != 1 || strings.Count(out, "gpu: endpoint flag cleared") != 1 ||
		!strings.Contains(out, "check=kv_leak") || !strings.Contains(out, "endpoint=http://a") {
		t.Errorf("log:\n%s", out)
	}
	st := e.chk.status(s.checks)
	if len(st) != 2 || st[0].Check != "kv_leak" || st[0].Flagged || st[0].TimesFlagged != 1 || st[0].FlaggedAt.IsZero() ||
		st[0].ClearedAt.IsZero() || !strings.Contains(st[0].Detail, "below") {
		t.Errorf("status %+v", st)
	}
}

// BenchmarkChecks is the per-scrape cost of the checks on a busy endpoint with a standing
// queue (both checks, a full history, every stall condition evaluated: the worst case),
// without the fetch and parse.
func BenchmarkChecks(b *testing.B) {
	checks := Checks{}.withDefaults()
	var k checker
	at := time.Unix(1_700_000_000, 0)
	has := hasWaiting | hasRunning | hasKV | hasThroughput
	var tr [4]transition
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		l := Load{Waiting: float64(2 + i%5), Running: 8, KVCacheUsage: 0.6, Throughput: float64(i) * 200}
		if f, _ := k.observe(&checks, &l, has, at.Add(time.Duration(i)*250*time.Millisecond), tr[:0]); f != 0 {
			b.Fatalf("flagged %v", f)
		}
	}
}
