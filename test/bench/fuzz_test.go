package main

import (
	"slices"
	"strings"
	"testing"
	"unicode"
)

// Fuzz tests of the harness's parsers: none may panic, and what they accept holds together.

func FuzzParseTargets(f *testing.F) {
	for _, s := range []string{"direct,sluice,nginx,haproxy", "direct,nginx", " HAProxy ,direct", "direct,,x", "", ",", "direct,direct"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseTargets(s)
		if err != nil {
			return
		}
		if len(got) < 2 || got[0] != "direct" {
			t.Fatalf("parseTargets(%q) = %v: want direct first and a proxy", s, got)
		}
		for i, name := range got {
			j := slices.Index(allTargets, name)
			if j < 0 || (i > 0 && j <= slices.Index(allTargets, got[i-1])) {
				t.Fatalf("parseTargets(%q) = %v: not an ordered subset of %v", s, got, allTargets)
			}
		}
	})
}

func FuzzParseStat(f *testing.F) {
	f.Add("4242 (ngi nx) w) S 4200 4242 4242 0 -1 4194560 300 0 0 0 123 45 0 0 20 0 1 0 100 1000 200 18446744073709551615\n")
	f.Add("1 (x) S 0 1 1 0 -1 0 0 0 0 0 1 2 -3 -4")
	f.Add(")")
	f.Fuzz(func(t *testing.T, s string) {
		st, err := parseStat([]byte(s))
		if err == nil && !strings.Contains(s, ")") {
			t.Fatalf("parseStat(%q) = %+v without a command name", s, st)
		}
	})
}

func FuzzParseStatus(f *testing.F) {
	f.Add("Name:\tnginx\nVmHWM:\t    26624 kB\nThreads:\t2\n")
	f.Add("VmHWM: x kB\nThreads: -1\n")
	f.Fuzz(func(t *testing.T, s string) {
		if v, err := parseVmHWM([]byte(s)); err == nil && v%1024 != 0 {
			t.Fatalf("parseVmHWM(%q) = %d: not whole kB", s, v)
		}
		if n, err := parseThreads([]byte(s)); err == nil && n < 1 {
			t.Fatalf("parseThreads(%q) = %d", s, n)
		}
		if n := parseGoroutines(strings.NewReader(s)); n < -1 {
			t.Fatalf("parseGoroutines(%q) = %d", s, n)
		}
	})
}

func FuzzParseMachineBusy(f *testing.F) {
	f.Add("cpu  100 2 30 5000 40 5 6 7 0 0\n")
	f.Add("cpu 1 2 3 4 5 6 7 x\n")
	f.Fuzz(func(t *testing.T, s string) {
		if _, err := parseMachineBusy([]byte(s)); err == nil && !strings.HasPrefix(strings.TrimLeftFunc(s, unicode.IsSpace), "cpu") {
			t.Fatalf("parseMachineBusy(%q) accepted a line that is not cpu", s)
		}
	})
}

func FuzzParseWrk(f *testing.F) {
	f.Add(wrkOut)
	f.Add("1 requests in 1.0s,\nRequests/sec: 1\n")
	f.Fuzz(func(t *testing.T, s string) {
		w, err := parseWrk(s)
		if err == nil && (w.requests < 0 || w.rps < 0 || w.non2xx < 0) {
			t.Fatalf("parseWrk(%q) = %+v", s, w)
		}
	})
}

func FuzzParseGoBench(f *testing.F) {
	f.Add("BenchmarkStreamRelay/events=16-2 \t 34678\t 36114 ns/op\t 2.801 allocs/event\t 56 allocs/op\nPASS")
	f.Add("Benchmark 1 x")
	f.Fuzz(func(t *testing.T, s string) {
		for _, b := range parseGoBench(s) {
			if !strings.HasPrefix(b.name, "Benchmark") || b.metrics == nil {
				t.Fatalf("parseGoBench(%q): %+v", s, b)
			}
		}
	})
}
