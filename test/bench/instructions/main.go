// Command instructions counts what one request costs a proxy in user space, without the
// noise of a timed run: the instructions a proxy process executes for a request (valgrind's
// callgrind, which counts instructions, not seconds: the same binary and load give the same
// count whatever else the machine does) and, for Sluice, its heap allocations and bytes (from
// go_memstats on its /metrics, in a run without valgrind).
//
// Each target runs in front of `sluice mock` (zero delay); after a warm-up the counters are
// zeroed, n small non-streaming chat requests (the harness's) are sent one after the other
// over one keep-alive connection, and the counters read. The kernel's work (the system
// calls) is not counted: that is what the harness's stime shows.
//
//	go run ./test/bench/instructions [--sluice BIN] [--n 4000] [--targets sluice,nginx] [--runs 3] [--headers minimal|sdk] [--dump DIR]
//
// Targets: sluice (every default on), nginx, and the bare proxies of test/bench/goproxy:
// own (Sluice's HTTP/1.1 server and upstream client with a handler that only forwards: the
// machinery without the gateway's work) and fasthttp. Needs valgrind (Debian's valgrind) and,
// for the nginx target, nginx.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const body = `{"model":"sim-llama","messages":[{"role":"user","content":"Write one line about the sea."}],"max_tokens":16}`

// extra are the headers each request carries besides Go's client's own (Host, User-Agent,
// Content-Length, Content-Type, Accept-Encoding).
var extra map[string]string

// sdkHeaders are those of the official openai-go client (v3: internal/requestconfig) with an
// API key, arriving through a load balancer that says whom it forwards for.
var sdkHeaders = map[string]string{
	"User-Agent":                  "OpenAI/Go 3.98.0",
	"Accept":                      "application/json",
	"Authorization":               "Bearer sk-proj-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOP",
	"X-Stainless-Lang":            "go",
	"X-Stainless-Package-Version": "3.98.0",
	"X-Stainless-Os":              "Linux",
	"X-Stainless-Arch":            "x64",
	"X-Stainless-Runtime":         "go",
	"X-Stainless-Runtime-Version": "go1.26.8",
	"X-Stainless-Retry-Count":     "0",
	"X-Forwarded-For":             "203.0.113.7",
	"X-Forwarded-Proto":           "https",
}

func main() {
	bin := flag.String("sluice", "", "sluice binary (default: build ./cmd/sluice)")
	n := flag.Int("n", 4000, "requests counted")
	targets := flag.String("targets", "sluice,nginx", "any of sluice, nginx, own, fasthttp")
	runs := flag.Int("runs", 3, "counts per target (the least is reported: see run)")
	dump := flag.String("dump", "", "keep the callgrind dump of each target's least run in this directory (TARGET.callgrind), for callgrind_annotate")
	headers := flag.String("headers", "minimal", "the requests' headers: minimal (Go's client: 5) or sdk (the official openai-go client's, with a key, behind a load balancer: 16)")
	flag.Parse()
	switch *headers {
	case "minimal":
	case "sdk":
		extra = sdkHeaders
	default:
		fmt.Fprintln(os.Stderr, "instructions: --headers minimal or sdk")
		os.Exit(2)
	}
	if *n < 100 || *n > 100000 || *runs < 1 || *runs > 10 {
		fmt.Fprintln(os.Stderr, "instructions: --n 100..100000, --runs 1..10")
		os.Exit(2)
	}
	if err := run(*bin, *n, *runs, strings.Split(*targets, ","), *dump); err != nil {
		fmt.Fprintln(os.Stderr, "instructions:", err)
		os.Exit(1)
	}
}

func run(bin string, n, runs int, targets []string, dump string) error {
	if _, err := exec.LookPath("valgrind"); err != nil {
		return errors.New("valgrind is not installed (apt-get install valgrind)")
	}
	tmp, err := os.MkdirTemp("", "instructions")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if bin == "" {
		if bin, err = build(tmp, "./cmd/sluice"); err != nil {
			return err
		}
	}
	var goproxy string // test/bench/goproxy, built for the bare targets
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	sim, gw, admin := ports[0], ports[1], ports[2]
	simProc, err := start(tmp, "sim", exec.Command(bin, "mock", "--listen", sim))
	if err != nil {
		return err
	}
	defer stop(simProc)
	if err := waitListen(sim, 10*time.Second); err != nil {
		return err
	}
	fmt.Printf("| target | run | user-space instructions a request | heap allocations a request | heap bytes a request |\n|---|---|---|---|---|\n")
	least := map[string]float64{}
	for _, t := range targets {
		for r := 1; r <= runs; r++ {
			var cmd *exec.Cmd
			allocs, bytes := "—", "—"
			switch t {
			case "sluice":
				a, b, err := sluiceAllocs(tmp, bin, sim, gw, admin, n)
				if err != nil {
					return err
				}
				allocs, bytes = strconv.FormatFloat(a, 'f', 1, 64), strconv.FormatFloat(b, 'f', 0, 64)
				cmd = exec.Command(bin, "serve", "--upstream", "http://"+sim, "--listen", gw, "--admin", admin)
			case "nginx":
				conf, err := nginxConf(tmp, sim, gw)
				if err != nil {
					return err
				}
				cmd = exec.Command("nginx", "-p", tmp, "-c", conf)
			case "own", "fasthttp":
				if goproxy == "" {
					if goproxy, err = build(tmp, "./test/bench/goproxy"); err != nil {
						return err
					}
				}
				cmd = exec.Command(goproxy, "serve-"+t+"-proxy", "http://"+sim, gw)
			default:
				return fmt.Errorf("unknown target %q (sluice, nginx, own, fasthttp)", t)
			}
			ins, data, err := count(tmp, cmd, gw, n)
			if err != nil {
				return fmt.Errorf("%s: %w", t, err)
			}
			fmt.Printf("| %s | %d | %.0f | %s | %s |\n", t, r, ins, allocs, bytes)
			if l, ok := least[t]; !ok || ins < l {
				least[t] = ins
				if dump != "" {
					if err := os.MkdirAll(dump, 0o755); err != nil {
						return err
					}
					if err := os.WriteFile(filepath.Join(dump, t+".callgrind"), data, 0o644); err != nil {
						return err
					}
				}
			}
		}
	}
	// Under valgrind a process runs some fifty times slower, so its timers (health checks,
	// model discovery, the processor sampler) fire fifty times more often a request: a count
	// above the others caught such background work, and the least is the request's own.
	fmt.Println()
	for _, t := range targets {
		fmt.Printf("%s: %.0f instructions a request (the least of %d runs)\n", t, least[t], runs)
	}
	if s, n := least["sluice"], least["nginx"]; s > 0 && n > 0 {
		fmt.Printf("Sluice ÷ nginx: %.2fx\n", s/n)
	}
	return nil
}

// build builds the command of package pkg into dir and returns the binary's path.
func build(dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	return bin, nil
}

// count runs cmd under callgrind and returns the instructions a request of n, and the dump.
func count(tmp string, cmd *exec.Cmd, addr string, n int) (float64, []byte, error) {
	out := filepath.Join(tmp, "cg.out")
	args := append([]string{"--tool=callgrind", "--callgrind-out-file=" + out, cmd.Path}, cmd.Args[1:]...)
	vg := exec.Command("valgrind", args...)
	// Asynchronous preemption's signals break callgrind's tracking of Go's threads.
	vg.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
	p, err := start(tmp, "valgrind", vg)
	if err != nil {
		return 0, nil, err
	}
	defer stop(p)
	if err := waitListen(addr, 2*time.Minute); err != nil {
		return 0, nil, err
	}
	if err := send(addr, 300); err != nil {
		return 0, nil, fmt.Errorf("warm-up: %w", err)
	}
	time.Sleep(time.Second)
	pid := strconv.Itoa(p.Process.Pid)
	if err := exec.Command("callgrind_control", "-z", pid).Run(); err != nil {
		return 0, nil, fmt.Errorf("callgrind_control -z: %w", err)
	}
	if err := send(addr, n); err != nil {
		return 0, nil, err
	}
	if err := exec.Command("callgrind_control", "-d", pid).Run(); err != nil {
		return 0, nil, fmt.Errorf("callgrind_control -d: %w", err)
	}
	dumps, _ := filepath.Glob(out + ".*")
	for _, d := range dumps {
		defer os.Remove(d)
	}
	if len(dumps) == 0 {
		return 0, nil, errors.New("callgrind wrote no dump")
	}
	last := dumps[len(dumps)-1]
	total, err := totals(last)
	if err != nil {
		return 0, nil, err
	}
	data, err := os.ReadFile(last)
	if err != nil {
		return 0, nil, err
	}
	return total / float64(n), data, nil
}

// totals reads the instruction count of a callgrind dump ("totals: N" or "summary: N").
func totals(path string) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		for _, p := range []string{"totals: ", "summary: "} {
			if v, ok := strings.CutPrefix(line, p); ok {
				f := strings.Fields(v)
				if len(f) == 0 {
					return 0, fmt.Errorf("%s: an empty %q line", path, strings.TrimSpace(p))
				}
				return strconv.ParseFloat(f[0], 64)
			}
		}
	}
	return 0, fmt.Errorf("%s: no totals line", path)
}

// sluiceAllocs runs Sluice without valgrind and returns its heap allocations and bytes a
// request over n requests.
func sluiceAllocs(tmp, bin, sim, gw, admin string, n int) (float64, float64, error) {
	p, err := start(tmp, "sluice", exec.Command(bin, "serve", "--upstream", "http://"+sim, "--listen", gw, "--admin", admin))
	if err != nil {
		return 0, 0, err
	}
	defer stop(p)
	if err := waitListen(gw, 30*time.Second); err != nil {
		return 0, 0, err
	}
	if err := send(gw, 500); err != nil {
		return 0, 0, err
	}
	a0, b0, err := memstats(admin)
	if err != nil {
		return 0, 0, err
	}
	if err := send(gw, n); err != nil {
		return 0, 0, err
	}
	a1, b1, err := memstats(admin)
	if err != nil {
		return 0, 0, err
	}
	return (a1 - a0) / float64(n), (b1 - b0) / float64(n), nil
}

func memstats(admin string) (mallocs, bytes float64, err error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	found := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		switch f[0] {
		case "go_memstats_mallocs_total":
			mallocs, err = strconv.ParseFloat(f[1], 64)
			found++
		case "go_memstats_alloc_bytes_total":
			bytes, err = strconv.ParseFloat(f[1], 64)
			found++
		}
		if err != nil {
			return 0, 0, err
		}
	}
	if found != 2 {
		return 0, 0, errors.New("/metrics has no go_memstats_mallocs_total and go_memstats_alloc_bytes_total")
	}
	return mallocs, bytes, sc.Err()
}

// send sends n chat requests one after the other over one keep-alive connection.
func send(addr string, n int) error {
	tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: time.Minute}
	for i := range n {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader([]byte(body)))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range extra {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("request %d: status %d: %s", i, resp.StatusCode, bytes.TrimSpace(answer))
		}
	}
	return nil
}

// nginxConf writes the harness's nginx proxy (one worker, in the foreground, no master).
func nginxConf(tmp, sim, listen string) (string, error) {
	conf := fmt.Sprintf(`worker_processes 1;
master_process off;
daemon off;
%s
pid %[2]s/nginx.pid;
error_log %[2]s/nginx-error.log;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  upstream sim { server %[3]s; keepalive 256; }
  server {
    listen %[4]s;
    location / {
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, userLine(), tmp, sim, listen)
	path := filepath.Join(tmp, "nginx.conf")
	return path, os.WriteFile(path, []byte(conf), 0o644)
}

func userLine() string {
	if os.Geteuid() == 0 {
		return "user root;"
	}
	return ""
}

// start runs cmd with its output in a log file of tmp.
func start(tmp, name string, cmd *exec.Cmd) (*exec.Cmd, error) {
	log, err := os.Create(filepath.Join(tmp, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return cmd, nil
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func waitListen(addr string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nothing listens on %s after %v", addr, limit)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePorts(n int) ([]string, error) {
	var out []string
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}
