// Command goproxy measures the CPU a request costs in Sluice against a bare Go reverse
// proxy (net/http's server and httputil.ReverseProxy over net/http's Transport: no policy,
// no telemetry), and optionally Sluice with net/http's server and client
// (http_server: net/http, clusters[].http_client: net/http): what Go's own machinery costs
// on this machine, beside what the gateway costs with every default policy on. Two more bare
// proxies (bare.go) split the gateway's cost: Sluice's own server and upstream client with a
// handler that only forwards (the machinery without the gateway's work), and valyala/fasthttp's
// server and client (the machinery issue 18 names as the alternative). Each proxy is
// its own process in front of `sluice mock` (zero delay); wrk drives them in alternating
// rounds and the CPU is utime+stime from /proc, divided by the requests wrk completed.
//
//	go run ./test/bench/goproxy [--rounds 5] [--duration 3s] [--connections 16]
//	go run ./test/bench/goproxy serve-reverse-proxy|serve-own-proxy|serve-fasthttp-proxy http://UPSTREAM LISTEN
//
// The second form runs one bare proxy alone, for other loads.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) == 4 {
		if serve, ok := bare[os.Args[1]]; ok {
			if err := serve(os.Args[2], os.Args[3]); err != nil {
				fmt.Fprintln(os.Stderr, "goproxy:", err)
				os.Exit(1)
			}
			return
		}
	}
	rounds := flag.Int("rounds", 5, "alternating rounds")
	dur := flag.Duration("duration", 3*time.Second, "one wrk run")
	conns := flag.Int("connections", 16, "wrk -c")
	flag.Parse()
	if *rounds < 1 || *rounds > 50 || *dur < time.Second || *dur > time.Minute || *conns < 1 || *conns > 1024 {
		fmt.Fprintln(os.Stderr, "goproxy: --rounds 1..50, --duration 1s..1m, --connections 1..1024")
		os.Exit(2)
	}
	if err := run(*rounds, *dur, *conns); err != nil {
		fmt.Fprintln(os.Stderr, "goproxy:", err)
		os.Exit(1)
	}
}

// serveReverseProxy is the bare Go proxy: what a Go gateway costs before it does anything.
func serveReverseProxy(upstream, listen string) error {
	u, err := url.Parse(upstream)
	if err != nil {
		return err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	rp.FlushInterval = -1 // relay as it comes, as the gateway does
	srv := &http.Server{Addr: listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

type target struct {
	name, addr string
	cmd        *exec.Cmd
	ticks      uint64
	requests   int
}

func run(rounds int, dur time.Duration, conns int) error {
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		return errors.New("wrk is not installed (apt-get install wrk)")
	}
	dir, err := os.MkdirTemp("", "goproxy-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/sluice").CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v\n%s", err, out)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ports, err := freePorts(8)
	if err != nil {
		return err
	}
	sim := ports[0]
	procs := []*exec.Cmd{exec.Command(bin, "mock", "--listen", sim)}
	ts := []*target{
		{name: "Sluice (every default on)", addr: ports[1], cmd: exec.Command(bin, "serve", "--upstream", "http://"+sim, "--listen", ports[1], "--admin", ports[2])},
		{name: "Go reverse proxy (httputil.ReverseProxy, net/http both sides)", addr: ports[3], cmd: exec.Command(self, "serve-reverse-proxy", "http://"+sim, ports[3])},
	}
	cfg := filepath.Join(dir, "nethttp.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, nethttpConfig, ports[4], ports[5], sim), 0o644); err != nil {
		return err
	}
	ts = append(ts, &target{name: "Sluice on net/http (http_server and http_client: net/http)", addr: ports[4], cmd: exec.Command(bin, "serve", "--config", cfg)},
		&target{name: "Sluice's machinery, bare (proxy/http1 server, proxy/upstream client, a handler that only forwards)", addr: ports[6], cmd: exec.Command(self, "serve-own-proxy", "http://"+sim, ports[6])},
		&target{name: "fasthttp, bare (fasthttp.Server, fasthttp.HostClient)", addr: ports[7], cmd: exec.Command(self, "serve-fasthttp-proxy", "http://"+sim, ports[7])})
	for _, t := range ts {
		procs = append(procs, t.cmd)
	}
	for _, c := range procs {
		c.Stdout, c.Stderr = nil, nil
		if err := c.Start(); err != nil {
			return err
		}
	}
	defer func() {
		for _, c := range procs {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	body := `{"model":"sim-llama","messages":[{"role":"user","content":"Write one line about the sea."}],"max_tokens":16}`
	script := filepath.Join(dir, "post.lua")
	lua := fmt.Sprintf("wrk.method = \"POST\"\nwrk.body = %q\nwrk.headers[\"Content-Type\"] = \"application/json\"\n", body)
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return err
	}
	for _, t := range ts {
		if err := waitPost(t.addr, body, 20*time.Second); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
	}
	reqs := regexp.MustCompile(`(\d+) requests in`)
	for r := 0; r < rounds; r++ {
		for i := range ts {
			t := ts[(i+r)%len(ts)] // the order rotates each round
			before, err := cpuTicks(t.cmd.Process.Pid)
			if err != nil {
				return err
			}
			out, err := exec.Command(wrk, "-t1", fmt.Sprintf("-c%d", conns), "-d"+dur.String(), "-s", script, "http://"+t.addr+"/v1/chat/completions").CombinedOutput()
			if err != nil {
				return fmt.Errorf("wrk: %v\n%s", err, out)
			}
			after, err := cpuTicks(t.cmd.Process.Pid)
			if err != nil {
				return err
			}
			m := reqs.FindSubmatch(out)
			if m == nil || strings.Contains(string(out), "Non-2xx") {
				return fmt.Errorf("%s: wrk says:\n%s", t.name, out)
			}
			n, _ := strconv.Atoi(string(m[1]))
			t.ticks += after - before
			t.requests += n
		}
	}
	fmt.Printf("wrk -t1 -c%d, %d rounds of %v per proxy, order rotated; upstream `sluice mock` (zero delay); all on this machine's %d CPUs\n\n", conns, rounds, dur, runtime.NumCPU())
	fmt.Println("| proxy | requests | req/s | CPU per request | ÷ Sluice |")
	fmt.Println("|---|---|---|---|---|")
	base := cpuPer(ts[0])
	for _, t := range ts {
		fmt.Printf("| %s | %d | %.0f | %.1f µs | %.2fx |\n", t.name, t.requests, float64(t.requests)/(float64(rounds)*dur.Seconds()), cpuPer(t), cpuPer(t)/base)
	}
	return nil
}

const nethttpConfig = `listen: %s
admin: {listen: %s}
http_server: net/http
clusters:
  - name: default
    http_client: net/http
    endpoints: [{url: "http://%s"}]
routes:
  - {name: default, match: {}, cluster: default}
`

func cpuPer(t *target) float64 {
	if t.requests == 0 {
		return 0
	}
	return float64(t.ticks) * 1e6 / clockTicks / float64(t.requests)
}

const clockTicks = 100 // USER_HZ on Linux

// cpuTicks is a process's utime+stime in clock ticks, from /proc/PID/stat.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+2:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	return u + st, nil
}

func freePorts(n int) ([]string, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

func waitPost(addr, body string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not answering at %s: %v", addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
