package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// These tests cover the harness's parsers and config; performance itself is measured by the
// harness, never asserted in tests.

func TestParseStat(t *testing.T) {
	// A command name with spaces and a parenthesis, as /proc allows.
	line := "4242 (ngi nx) w) S 4200 4242 4242 0 -1 4194560 300 0 0 0 123 45 0 0 20 0 1 0 100 1000 200 18446744073709551615\n"
	st, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.ppid != 4200 || st.ticks != 168 || st.sysTicks != 45 {
		t.Fatalf("got %+v, want ppid 4200 ticks 168 (45 of them system)", st)
	}
	if _, err := parseStat([]byte("4242 (x) S 1")); err == nil {
		t.Fatal("a short stat must be an error")
	}
	self, err := readStat(os.Getpid())
	if err != nil || self.ppid != os.Getppid() {
		t.Fatalf("readStat(self) = %+v, %v; want ppid %d", self, err, os.Getppid())
	}
}

func TestParseMachineBusy(t *testing.T) {
	busy, err := parseMachineBusy([]byte("cpu  100 2 30 5000 40 5 6 7 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"))
	if err != nil || busy != 100+2+30 {
		t.Fatalf("got %d, %v", busy, err)
	}
	if _, err := parseMachineBusy([]byte("intr 1 2 3")); err == nil {
		t.Fatal("a line that is not cpu must be an error")
	}
	m := &meter{}
	s := m.start(nil)
	ticks, foreign := m.stop(s)
	if ticks != 0 || foreign < 0 {
		t.Fatalf("stop = %d, %v", ticks, foreign)
	}
}

func TestParseVmHWM(t *testing.T) {
	v, err := parseVmHWM([]byte("Name:\tnginx\nVmPeak:\t  100 kB\nVmHWM:\t    26624 kB\nVmRSS:\t 1 kB\n"))
	if err != nil || v != 26624<<10 {
		t.Fatalf("got %d, %v", v, err)
	}
	if _, err := parseVmHWM([]byte("Name:\tx\n")); err == nil {
		t.Fatal("missing VmHWM must be an error")
	}
}

const wrkOut = `Running 5s test @ http://127.0.0.1:40000/v1/chat/completions
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.05ms    1.20ms  40.11ms   90.00%
    Req/Sec    10.52k     1.01k   12.00k    70.00%
  Latency Distribution
     50%  812.00us
     75%    3.50ms
     90%    4.20ms
     99%    1.02s
  104650 requests in 5.00s, 40.12MB read
  Socket errors: connect 0, read 0, write 0, timeout 3
  Non-2xx or 3xx responses: 7
Requests/sec:  20930.12
Transfer/sec:      8.02MB
`

func TestParseWrk(t *testing.T) {
	w, err := parseWrk(wrkOut)
	if err != nil {
		t.Fatal(err)
	}
	if w.requests != 104650 || w.seconds != 5 || w.rps != 20930.12 || w.non2xx != 7 {
		t.Fatalf("got %+v", w)
	}
	if w.p50 != 812*time.Microsecond || w.p99 != 1020*time.Millisecond {
		t.Fatalf("percentiles: p50 %v p99 %v", w.p50, w.p99)
	}
	if !strings.Contains(w.sockErrs, "timeout 3") {
		t.Fatalf("socket errors %q", w.sockErrs)
	}
	if _, err := parseWrk("garbage"); err == nil {
		t.Fatal("garbage must be an error")
	}
}

func TestParseGoBench(t *testing.T) {
	out := `goos: linux
BenchmarkStreamRelay/events=16-2 	   34678	     36114 ns/op	 108.43 MB/s	         2.801 allocs/event	      1806 ns/event	   13730 B/op	      56 allocs/op
BenchmarkRelayLoop/next+observe+write+flush-2         	 3591895	       334.0 ns/op	       0 B/op	       0 allocs/op
PASS`
	bs := parseGoBench(out)
	if len(bs) != 2 || bs[0].name != "BenchmarkStreamRelay/events=16" || bs[0].metrics["ns/event"] != 1806 || bs[0].metrics["allocs/op"] != 56 {
		t.Fatalf("got %+v", bs)
	}
	if bs[1].name != "BenchmarkRelayLoop/next+observe+write+flush" || bs[1].metrics["ns/op"] != 334 {
		t.Fatalf("got %+v", bs[1])
	}
}

func TestQuantileAndRotate(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	if q := quantile(ds, .5); q != 50 {
		t.Fatalf("p50 = %v", q)
	}
	if q := quantile(ds, .99); q != 99 {
		t.Fatalf("p99 = %v", q)
	}
	if quantile(nil, .5) != 0 {
		t.Fatal("empty quantile")
	}
	ts := []*target{{name: "a"}, {name: "b"}, {name: "c"}}
	seen := map[string]map[int]bool{}
	for r := range 3 {
		for pos, x := range rotate(ts, r) {
			if seen[x.name] == nil {
				seen[x.name] = map[int]bool{}
			}
			seen[x.name][pos] = true
		}
	}
	for name, pos := range seen {
		if len(pos) != 3 {
			t.Fatalf("%s took positions %v over 3 rounds, want all three", name, pos)
		}
	}
}

func TestNginxConf(t *testing.T) {
	dir := t.TempDir()
	p, err := writeNginxConf(dir, "127.0.0.1:1234", "127.0.0.1:5678")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	conf := string(b)
	for _, want := range []string{
		"proxy_buffering off;", "proxy_http_version 1.1;", `proxy_set_header Connection "";`,
		"keepalive 256;", "server 127.0.0.1:5678;", "listen 127.0.0.1:1234;", "worker_processes auto;",
		"pid " + filepath.Join(dir, "nginx.pid"), "access_log off;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q:\n%s", want, conf)
		}
	}
}

func TestHAProxyConf(t *testing.T) {
	dir := t.TempDir()
	p, err := writeHAProxyConf(dir, "127.0.0.1:1234", "127.0.0.1:5678", 2, 9000)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	conf := string(b)
	for _, want := range []string{
		"    nbthread 2\n", "    maxconn 9000\n", "    mode http\n", "    http-reuse always\n",
		"    option http-no-delay\n", "    no option http-buffer-request\n", "    option http-keep-alive\n",
		"    timeout client 120s\n", "    timeout http-keep-alive 120s\n", "    timeout server 300s\n",
		"    bind 127.0.0.1:1234\n", "    server sim 127.0.0.1:5678 pool-purge-delay 120s\n",
		"    pidfile " + filepath.Join(dir, "haproxy.pid") + "\n",
		"    stats socket " + filepath.Join(dir, "haproxy.sock") + " mode 600 level admin\n",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q:\n%s", want, conf)
		}
	}
	// Logging off: no log line, in global or defaults.
	for line := range strings.SplitSeq(conf, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "log" {
			t.Errorf("config logs: %q", line)
		}
	}
	// With haproxy installed, haproxy itself checks the config.
	if bin := lookTool("haproxy"); bin != "" {
		if out, err := runCmd(t.Context(), 30*time.Second, nil, bin, "-c", "-f", p); err != nil {
			t.Fatalf("haproxy -c rejects the config: %v\n%s", err, out)
		}
	}
}

func TestHAProxyLimits(t *testing.T) {
	for _, tc := range []struct {
		nofile uint64
		want   int
	}{
		{math.MaxUint64, 16384}, // RLIM_INFINITY
		{1 << 20, 16384},
		{2*16384 + 256, 16384},
		{20000, 9872}, // the reference container's hard limit
		{1024, 384},
		{300, 64},
		{0, 64},
	} {
		got := haproxyMaxconn(tc.nofile)
		if got != tc.want {
			t.Errorf("haproxyMaxconn(%d) = %d, want %d", tc.nofile, got, tc.want)
		}
		if tc.nofile >= 2*64+256 && uint64(2*got+256) > tc.nofile {
			t.Errorf("haproxyMaxconn(%d) = %d needs more descriptors than the limit", tc.nofile, got)
		}
	}
	for _, tc := range []struct{ cpus, want int }{{0, 1}, {1, 1}, {2, 2}, {16, 16}, {200, 64}} {
		if got := haproxyThreads(tc.cpus); got != tc.want {
			t.Errorf("haproxyThreads(%d) = %d, want %d", tc.cpus, got, tc.want)
		}
	}
}

func TestParseThreads(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"Name:\thaproxy\nThreads:\t2\nSigQ:\t0/1\n", 2, false},
		{"Threads: 17", 17, false},
		{"Name:\tx\n", 0, true},
		{"Threads:\tmany\n", 0, true},
		{"Threads:\t0\n", 0, true},
	} {
		got, err := parseThreads([]byte(tc.in))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseThreads(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
	n, err := readThreads(os.Getpid())
	if err != nil || n < 1 {
		t.Fatalf("readThreads(self) = %d, %v", n, err)
	}
}

func TestParseTargets(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{"direct,sluice,nginx,haproxy", []string{"direct", "sluice", "nginx", "haproxy"}, ""},
		{"direct,sluice,nginx", []string{"direct", "sluice", "nginx"}, ""},
		{" HAProxy , direct ", []string{"direct", "haproxy"}, ""},
		{"nginx,direct,sluice", []string{"direct", "sluice", "nginx"}, ""},
		{"direct", nil, "at least one proxy"},
		{"sluice,nginx", nil, "direct is required"},
		{"direct,envoy", nil, `unknown target "envoy"`},
		{"direct,nginx,nginx", nil, `"nginx" named twice`},
		{"direct,,nginx", nil, "an empty name"},
		{"", nil, "direct is required"},
	} {
		got, err := parseTargets(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseTargets(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseTargets(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	// Every problem at once.
	_, err := parseTargets("sluice,envoy,sluice")
	for _, want := range []string{"unknown target", "named twice", "direct is required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseTargets(sluice,envoy,sluice): %v lacks %q", err, want)
		}
	}
}

func TestFlags(t *testing.T) {
	var sb strings.Builder
	o, err := parseFlags([]string{"--quick", "--rounds", "2"}, &sb)
	if err != nil {
		t.Fatal(err)
	}
	if o.duration != 2*time.Second || o.rounds != 2 || len(o.rates) != 3 {
		t.Fatalf("quick with --rounds 2: %+v", o)
	}
	if !slices.Equal(o.targets, allTargets) {
		t.Fatalf("default targets %v, want %v", o.targets, allTargets)
	}
	o, err = parseFlags([]string{"--targets", "direct,sluice,nginx"}, &sb)
	if err != nil || o.has("haproxy") || !o.has("nginx") {
		t.Fatalf("--targets direct,sluice,nginx: %v, %v", o.targets, err)
	}
	for _, args := range [][]string{
		{"--rates", "10,x"},
		{"--targets", "direct,squid"},
		{"--targets", "direct,nginx", "--perf"},
		{"--targets", "direct,haproxy", "--sluice-env", "GOGC=200"},
	} {
		if _, err := parseFlags(args, &sb); err == nil {
			t.Errorf("parseFlags(%q) must be rejected", args)
		}
	}
}

func TestParseGoroutines(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"# HELP go_goroutines Number of goroutines that currently exist.\n# TYPE go_goroutines gauge\ngo_goroutines 19\n", 19},
		{"go_goroutines_total 5\ngo_goroutines 7e+00\n", 7},
		{"go_threads 9\n", -1},
		{"go_goroutines NaN\n", -1},
		{"go_goroutines -3\n", -1},
		{"", -1},
	} {
		if got := parseGoroutines(strings.NewReader(tc.in)); got != tc.want {
			t.Errorf("parseGoroutines(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
	if v, err := parseStatusKB([]byte("Name:\tsluice\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n"), "VmRSS"); err != nil || v != 1<<20 {
		t.Errorf("VmRSS = %d, %v, want 1 MiB", v, err)
	}
}
