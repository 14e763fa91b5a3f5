// Command abuse measures what hostile clients and misbehaving upstreams can take of a Sluice
// gateway: the figures of "Clients and hostile input" in docs/running.md. It builds the
// sluice binary, runs `sluice mock` and `sluice serve` as child processes on 127.0.0.1 (so
// that the gateway's memory, goroutines and descriptors are its own, read from its /metrics),
// a small misbehaving upstream in this process, and one probe after another:
//
//   - slow bodies: connections that send headers and part of a body, then nothing;
//   - slow readers: streams whose client never reads;
//   - unterminated headers: connections sending just under the header bound, never ending;
//   - huge n: one request asking n = 200,000,000 of 4,096 tokens from a token-limited route;
//   - model names: requests with random 16 KiB model names, then one /metrics scrape;
//   - large answers: concurrent non-streaming answers of 100 MiB;
//   - a connection flood from one address past the per-client bound;
//   - idle streams: thousands of streams from a slow model (one token, then a long pause),
//     the gateway's memory and goroutines while they are held and after they end.
//
// It prints one markdown table. See that section for a run.
//
//	go run ./test/bench/abuse [--conns 2000] [--readers 500] [--names 2000] [--answers 20] [--idle 9000] [--only idle]
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type options struct {
	conns, readers, names, answers int
	answerMiB                      int
	idle                           int           // idle streams held at once
	idleFor                        time.Duration // the slow model's pause after the first token
	only                           string        // run this probe alone ("" every one)
	bodyTimeout, writeTimeout      time.Duration
	keep                           bool
}

func main() {
	var o options
	flag.IntVar(&o.conns, "conns", 2000, "slow-body and unterminated-header connections")
	flag.IntVar(&o.readers, "readers", 500, "streams whose client never reads")
	flag.IntVar(&o.names, "names", 2000, "requests with random 16 KiB model names")
	flag.IntVar(&o.answers, "answers", 20, "concurrent large non-streaming answers")
	flag.IntVar(&o.answerMiB, "answer-mib", 100, "size of each large answer, MiB")
	flag.DurationVar(&o.bodyTimeout, "body-timeout", 5*time.Second, "the gateway's timeouts.body (default 30s in a real config)")
	flag.DurationVar(&o.writeTimeout, "write-timeout", 5*time.Second, "the gateway's timeouts.write (default 30s in a real config)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.IntVar(&o.idle, "idle", 9000, "idle streams held at once (each takes two of the gateway's descriptors)")
	flag.DurationVar(&o.idleFor, "idle-for", 20*time.Second, "how long each idle stream waits after its first token")
	flag.StringVar(&o.only, "only", "", "run one probe alone: slow-bodies, slow-readers, headers, huge-n, names, answers, flood, idle")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "abuse:", err)
		os.Exit(1)
	}
}

// row is one line of the report.
type row struct{ probe, measured, note string }

func run(o options) error {
	dir, err := os.MkdirTemp("", "sluice-abuse-")
	if err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(dir)
	}
	bin := filepath.Join(dir, "sluice")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v\n%s", err, out)
	}
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	mockAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	slowAddr := fmt.Sprintf("127.0.0.1:%d", ports[3])
	gwAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	adminAddr := fmt.Sprintf("127.0.0.1:%d", ports[2])
	big, err := startBigUpstream(o.answerMiB << 20)
	if err != nil {
		return err
	}
	defer big.Close()
	flood, err := startFloodUpstream()
	if err != nil {
		return err
	}
	defer flood.Close()
	cfg := fmt.Sprintf(`listen: %s
admin: {listen: %s}
timeouts: {body: %s, write: %s}
limits: {max_connections_per_client: %d}
clusters:
  - {name: mock, endpoints: [{url: "http://%s"}]}
  - {name: big, endpoints: [{url: "http://%s"}], health_check: {disabled: true}}
  - {name: flood, endpoints: [{url: "http://%s"}], health_check: {disabled: true}}
  - {name: slow, endpoints: [{url: "http://%s"}], health_check: {disabled: true}, max_idle_conns_per_host: 16}
routes:
  - {name: slow, match: {model: slow}, cluster: slow, model: sim-llama, timeouts: {idle: 5m, total: 10m}}
  - {name: big, match: {model: big}, cluster: big}
  - {name: flood, match: {model: flood}, cluster: flood}
  - name: limited
    match: {model: limited}
    cluster: mock
    model: sim-llama
    policies: [{type: ratelimit, params: {tokens_per_minute: 100000}}]
  - {name: all, cluster: mock}
`, gwAddr, adminAddr, o.bodyTimeout, o.writeTimeout, clientBound(o), mockAddr, big.Addr(), flood.Addr(), slowAddr)
	cfgPath := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	mock, err := startChild(dir, "mock", bin, "mock", "--listen", mockAddr, "--itl", "1ms", "--max-running", "4096")
	if err != nil {
		return err
	}
	defer mock.stop()
	slow, err := startChild(dir, "slow-mock", bin, "mock", "--listen", slowAddr, "--itl", "1ms",
		"--max-running", strconv.Itoa(o.idle+64), "--kv-tokens", strconv.Itoa(max(1<<20, 256*(o.idle+64))))
	if err != nil {
		return err
	}
	defer slow.stop()
	gw, err := startChild(dir, "gateway", bin, "serve", "--config", cfgPath, "--log-level", "error")
	if err != nil {
		return err
	}
	defer gw.stop()
	if err := waitUp("http://"+adminAddr+"/readyz", 20*time.Second); err != nil {
		return fmt.Errorf("gateway: %w\n%s", err, gw.tail())
	}
	m := &metrics{admin: "http://" + adminAddr, pid: gw.cmd.Process.Pid}
	base := m.read()
	fmt.Printf("gateway at rest: %d goroutines, %.0f MiB RSS, %d open fds\n\n", base.goroutines, base.rssMiB, base.fds)

	var rows []row
	for _, p := range []struct {
		name string
		run  func() (row, error)
	}{
		{"slow-bodies", func() (row, error) { return slowBodies(o, gwAddr, m, base) }},
		{"slow-readers", func() (row, error) { return slowReaders(o, gwAddr, m, base, flood) }},
		{"headers", func() (row, error) { return unterminatedHeaders(o, gwAddr, m, base) }},
		{"huge-n", func() (row, error) { return hugeN(gwAddr) }},
		{"names", func() (row, error) { return modelNames(o, gwAddr, m) }},
		{"answers", func() (row, error) { return largeAnswers(o, gwAddr, gw) }},
		{"flood", func() (row, error) { return connectionFlood(o, gwAddr, m) }},
		{"idle", func() (row, error) { return idleStreams(o, gwAddr, m, base) }},
	} {
		if o.only != "" && o.only != p.name {
			continue
		}
		r, err := p.run()
		if err != nil {
			return err
		}
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "%s: %s\n", r.probe, r.measured)
	}
	fmt.Println("| probe | measured | |")
	fmt.Println("|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %s |\n", r.probe, r.measured, r.note)
	}
	return nil
}

// slowBodies opens connections that send headers and 10 bytes of a 1,000-byte body.
func slowBodies(o options, gw string, m *metrics, base snapshot) (row, error) {
	conns, err := dialMany(gw, o.conns, func(c net.Conn) error {
		_, err := fmt.Fprint(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
		return err
	})
	if err != nil {
		return row{}, err
	}
	defer closeAll(conns)
	time.Sleep(time.Second)
	held := m.read()
	start := time.Now()
	answered := readAll(conns, o.bodyTimeout+10*time.Second, " 408 ")
	el := time.Since(start)
	after := m.waitBack(base, 10*time.Second)
	return row{"slow bodies", fmt.Sprintf("%d connections: held %d goroutines, %.0f MiB RSS; %d answered 408 within %.1fs of the %s body time-out; after: %d goroutines, %d connections open",
		o.conns, held.goroutines, held.rssMiB, answered, el.Seconds()+1, o.bodyTimeout, after.goroutines, after.open), "`timeouts.body`"}, nil
}

// slowReaders starts streams whose client never reads a byte of the answer, from an upstream
// that streams 32 KiB events as fast as it can.
func slowReaders(o options, gw string, m *metrics, base snapshot, flood *floodUpstream) (row, error) {
	body := `{"model":"flood","stream":true,"messages":[{"role":"user","content":"tell me everything"}]}`
	conns, err := dialMany(gw, o.readers, func(c net.Conn) error {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4 << 10)
		}
		_, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		return err
	})
	if err != nil {
		return row{}, err
	}
	defer closeAll(conns)
	start := time.Now()
	deadline := start.Add(o.writeTimeout + 60*time.Second)
	var stalled float64
	for time.Now().Before(deadline) {
		stalled = m.value("sluice_requests_total", `error_type="client_stalled"`)
		if flood.active.Load() == 0 { // every upstream request released
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	el := time.Since(start)
	// The outcomes are recorded after the upstream requests are released (a handler ends its
	// request once its write failed): on a busy machine some come later than the last
	// release, so they are waited for (at most the write time-out more), not read early.
	for settle := time.Now().Add(o.writeTimeout); stalled < float64(len(conns)) && time.Now().Before(settle); {
		time.Sleep(100 * time.Millisecond)
		stalled = m.value("sluice_requests_total", `error_type="client_stalled"`)
	}
	after := m.waitBack(base, 10*time.Second)
	return row{"slow readers", fmt.Sprintf("%d streams never read: %d dropped as client_stalled, every upstream request released %.1fs after they started (write time-out %s); after: %d goroutines",
		len(conns), int(stalled), el.Seconds(), o.writeTimeout, after.goroutines), "`timeouts.write`"}, nil
}

// unterminatedHeaders opens connections sending 60 KiB of headers that never end.
func unterminatedHeaders(o options, gw string, m *metrics, base snapshot) (row, error) {
	line := "X-Filler: " + strings.Repeat("a", 1000) + "\r\n"
	conns, err := dialMany(gw, o.conns/2, func(c net.Conn) error {
		if _, err := fmt.Fprint(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n"); err != nil {
			return err
		}
		for range 60 {
			if _, err := io.WriteString(c, line); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return row{}, err
	}
	defer closeAll(conns)
	time.Sleep(time.Second)
	held := m.read()
	// One more over the bound: 431.
	c, err := net.Dial("tcp", gw)
	if err != nil {
		return row{}, err
	}
	fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 100<<10))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	status, _ := bufio.NewReader(c).ReadString('\n')
	c.Close()
	start := time.Now()
	closed := readAll(conns, 20*time.Second, "")
	return row{"unterminated headers", fmt.Sprintf("%d connections of 60 KiB of headers: held %.0f MiB RSS, all %d closed %.1fs later (header time-out 10s); 100 KiB of headers: %s",
		len(conns), held.rssMiB, closed, time.Since(start).Seconds()+1, strings.TrimSpace(status)), "`limits.max_header_bytes`"}, nil
}

// hugeN sends one request whose token charge no bucket can hold.
func hugeN(gw string) (row, error) {
	body := `{"model":"limited","n":200000000,"max_tokens":4096,"messages":[{"role":"user","content":"hi"}]}`
	start := time.Now()
	resp, err := http.Post("http://"+gw+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return row{}, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	el := time.Since(start)
	// And a charge larger than the bucket with an ordinary n.
	body2 := `{"model":"limited","n":100,"max_tokens":4096,"messages":[{"role":"user","content":"hi"}]}`
	start2 := time.Now()
	resp2, err := http.Post("http://"+gw+"/v1/chat/completions", "application/json", strings.NewReader(body2))
	if err != nil {
		return row{}, err
	}
	b2, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	return row{"huge n", fmt.Sprintf("n=200,000,000 × 4,096: %d %s in %.1f ms; n=100 × 4,096 on a 100,000 TPM bucket: %d %s in %.1f ms",
		resp.StatusCode, errCode(b), float64(el.Microseconds())/1000, resp2.StatusCode, errCode(b2), float64(time.Since(start2).Microseconds())/1000), "n ≤ 128; charges in O(1)"}, nil
}

// modelNames sends requests with random 16 KiB model names, then scrapes /metrics once.
func modelNames(o options, gw string, m *metrics) (row, error) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for range o.names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			buf := make([]byte, 8<<10)
			_, _ = rand.Read(buf)
			body := `{"model":"` + hex.EncodeToString(buf) + `","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
			resp, err := http.Post("http://"+gw+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	start := time.Now()
	n, err := m.scrapeSize()
	if err != nil {
		return row{}, err
	}
	return row{"client model names", fmt.Sprintf("%d random 16 KiB names: /metrics %d KiB, scraped in %.1f ms", o.names, n>>10, float64(time.Since(start).Microseconds())/1000), "labels bounded: unknown names are `other`"}, nil
}

// largeAnswers asks for concurrent non-streaming answers of answerMiB each.
func largeAnswers(o options, gw string, gwProc *child) (row, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got int64
	var failed int
	start := time.Now()
	for range o.answers {
		wg.Go(func() {
			resp, err := http.Post("http://"+gw+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"big","messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
				return
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			got += n
			if resp.StatusCode != 200 {
				failed++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	hwm := gwProc.peakRSSMiB()
	return row{"large answers", fmt.Sprintf("%d concurrent %d MiB answers: %d MiB relayed in %.1fs, %d failed; gateway peak RSS %.0f MiB",
		o.answers, o.answerMiB, got>>20, time.Since(start).Seconds(), failed, hwm), "`limits.max_buffered_answer` / `max_buffered_total`"}, nil
}

// connectionFlood opens more connections from one address than the per-client bound allows.
// clientBound is the gateway's limits.max_connections_per_client in the probes' config: the
// flood's bound, above what the idle-stream probe holds from its one address.
func clientBound(o options) int { return max(4*o.conns, o.idle+64) }

func connectionFlood(o options, gw string, m *metrics) (row, error) {
	limit := clientBound(o) // 4 × conns alone was under the bound once the idle probe grew past it
	// The counter is cumulative: the flood's own refusals are what it adds (earlier probes
	// may have been refused too).
	before := m.value("sluice_connections_rejected_total", `bound="client"`)
	conns, _ := dialMany(gw, limit+200, func(net.Conn) error { return nil })
	defer closeAll(conns)
	time.Sleep(time.Second)
	s := m.read()
	rejected := m.value("sluice_connections_rejected_total", `bound="client"`) - before
	resp, err := http.Get(m.admin + "/healthz")
	admin := "unreachable"
	if err == nil {
		admin = resp.Status
		resp.Body.Close()
	}
	return row{"connection flood", fmt.Sprintf("%d connections from one address (bound %d): %d open, %.0f refused; admin /healthz %s",
		len(conns), limit, s.open, rejected, admin), "`limits.max_connections_per_client`, `limits.max_connections`"}, nil
}

// idleStreams holds o.idle streams from a slow model at once: each gets its first token, then
// waits o.idleFor for the rest. It reads the gateway's goroutines and memory at rest, while
// the streams are held, and after they ended (and a GC).
func idleStreams(o options, gw string, m *metrics, base snapshot) (row, error) {
	body := `{"model":"slow","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"wait for it"}]}`
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Sim-Stall-After: 1\r\nX-Sim-Stall-For: %s\r\nContent-Length: %d\r\n\r\n%s",
		o.idleFor, len(body), body)
	start := time.Now()
	conns, err := dialMany(gw, o.idle, func(c net.Conn) error {
		_, err := io.WriteString(c, req)
		return err
	})
	if err != nil {
		return row{}, err
	}
	defer closeAll(conns)
	// Every stream's first token, then the streams are held (idle) for the rest of idleFor.
	readers := make([]*bufio.Reader, len(conns))
	var first atomic.Int64
	var wg sync.WaitGroup
	for i, c := range conns {
		readers[i] = bufio.NewReaderSize(c, 4<<10)
		wg.Go(func() {
			if readUntil(c, readers[i], "data: {", time.Now().Add(o.idleFor)) {
				first.Add(1)
			}
		})
	}
	wg.Wait()
	opened := time.Since(start)
	held := m.read()
	var done atomic.Int64
	for i, c := range conns {
		wg.Go(func() {
			if readUntil(c, readers[i], "data: [DONE]", time.Now().Add(o.idleFor+2*time.Minute)) {
				done.Add(1)
			}
		})
	}
	wg.Wait()
	closeAll(conns)
	if resp, err := http.Get(m.admin + "/debug/pprof/heap?gc=1"); err == nil { // a GC, as an idle gateway's next would
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	after := m.waitBack(base, 30*time.Second)
	time.Sleep(5 * time.Second)
	last := m.read()
	after.rssMiB, after.anonMiB = last.rssMiB, last.anonMiB
	per := (held.rssMiB - base.rssMiB) * (1 << 10) / float64(max(first.Load(), 1))
	return row{"idle streams", fmt.Sprintf("%d streams held (%d got their first token within %.1fs, %d ended whole): at rest %d goroutines / %.0f MiB RSS (%.0f anonymous); held %d goroutines / %.0f MiB RSS (%.0f anonymous; %.0f KiB per stream); 5 s after %d goroutines / %.0f MiB RSS (%.0f anonymous)",
		len(conns), first.Load(), opened.Seconds(), done.Load(), base.goroutines, base.rssMiB, base.anonMiB, held.goroutines, held.rssMiB, held.anonMiB, per, after.goroutines, after.rssMiB, after.anonMiB), "slow model"}, nil
}

// readUntil reads c until a line starts with prefix (true), or it fails or deadline passes.
func readUntil(c net.Conn, br *bufio.Reader, prefix string, deadline time.Time) bool {
	_ = c.SetReadDeadline(deadline)
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, prefix) {
			return true
		}
		if err != nil {
			return false
		}
	}
}

// dialMany opens n connections and runs send on each (concurrently, 64 at a time).
func dialMany(addr string, n int, send func(net.Conn) error) ([]net.Conn, error) {
	var mu sync.Mutex
	var out []net.Conn
	var first error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err == nil {
				err = send(c)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if c != nil {
					c.Close()
				}
				if first == nil && !errors.Is(err, syscall.ECONNRESET) {
					first = err
				}
				return
			}
			out = append(out, c)
		}()
	}
	wg.Wait()
	if len(out) == 0 && first != nil {
		return nil, first
	}
	return out, nil
}

// readAll reads from every connection until it answers (its status line contains want, or
// any answer when want is "") or closes, within d; it returns how many did.
func readAll(conns []net.Conn, d time.Duration, want string) int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(d))
			line, err := bufio.NewReader(c).ReadString('\n')
			ok := (want == "" && (err != nil && !isTimeout(err) || line != "")) || (want != "" && strings.Contains(line, want))
			if ok {
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return n
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func closeAll(cs []net.Conn) {
	for _, c := range cs {
		c.Close()
	}
}

func errCode(b []byte) string {
	s := string(b)
	if i := strings.Index(s, `"code":"`); i >= 0 {
		s = s[i+8:]
		if j := strings.IndexByte(s, '"'); j >= 0 {
			return s[:j]
		}
	}
	return ""
}

// startBigUpstream serves a chat completion of size bytes to every request.
func startBigUpstream(size int) (*bigUpstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	head := `{"id":"x","object":"chat.completion","created":1,"model":"big","choices":[{"index":0,"message":{"role":"assistant","content":"`
	tail := `"},"finish_reason":"stop"}]}`
	fill := size - len(head) - len(tail)
	chunk := []byte(strings.Repeat("a", 64<<10))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(size))
		_, _ = io.WriteString(w, head)
		for left := fill; left > 0; left -= len(chunk) {
			if _, err := w.Write(chunk[:min(left, len(chunk))]); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, tail)
	})}
	go func() { _ = srv.Serve(ln) }()
	return &bigUpstream{srv: srv, ln: ln}, nil
}

type bigUpstream struct {
	srv *http.Server
	ln  net.Listener
}

func (b *bigUpstream) Addr() string { return b.ln.Addr().String() }
func (b *bigUpstream) Close()       { _ = b.srv.Close() }

// floodUpstream streams 32 KiB chat chunks as fast as the gateway takes them, counting the
// streams in progress.
type floodUpstream struct {
	srv    *http.Server
	ln     net.Listener
	active atomic.Int64
}

func startFloodUpstream() (*floodUpstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &floodUpstream{ln: ln}
	ev := []byte("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("a", 32<<10) + "\"}}]}\n\n")
	f.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			return
		}
		f.active.Add(1)
		defer f.active.Add(-1)
		w.Header().Set("Content-Type", "text/event-stream")
		for r.Context().Err() == nil {
			if _, err := w.Write(ev); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})}
	go func() { _ = f.srv.Serve(ln) }()
	return f, nil
}

func (f *floodUpstream) Addr() string { return f.ln.Addr().String() }
func (f *floodUpstream) Close()       { _ = f.srv.Close() }

// metrics reads the gateway's own figures from its /metrics, and its anonymous memory from
// /proc.
type metrics struct {
	admin string
	pid   int
}

type snapshot struct {
	goroutines, fds, open int
	rssMiB                float64
	// anonMiB is the anonymous part of the RSS (RssAnon): the heap, stacks and runtime
	// structures, without the pages of the executable the kernel keeps mapped once touched.
	anonMiB float64
}

func (m *metrics) read() snapshot {
	return snapshot{
		goroutines: int(m.value("go_goroutines")),
		fds:        int(m.value("process_open_fds")),
		open:       int(m.value("sluice_connections_open")),
		rssMiB:     m.value("process_resident_memory_bytes") / (1 << 20),
		anonMiB:    procStatusKiB(m.pid, "RssAnon") / 1024,
	}
}

// waitBack waits until the goroutines are back near base (or d passes) and returns the reading.
func (m *metrics) waitBack(base snapshot, d time.Duration) snapshot {
	deadline := time.Now().Add(d)
	for {
		s := m.read()
		if s.goroutines <= base.goroutines+10 || time.Now().After(deadline) {
			return s
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (m *metrics) value(name string, labels ...string) float64 {
	resp, err := http.Get(m.admin + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

func (m *metrics) scrapeSize() (int, error) {
	resp, err := http.Get(m.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	return int(n), err
}

// child is a process the harness started.
type child struct {
	cmd *exec.Cmd
	log string
}

func startChild(dir, name, bin string, args ...string) (*child, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &child{cmd: cmd, log: logPath}, nil
}

func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

func (c *child) tail() string {
	b, _ := os.ReadFile(c.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// peakRSSMiB is the process's VmHWM.
func (c *child) peakRSSMiB() float64 {
	if kib := procStatusKiB(c.cmd.Process.Pid, "VmHWM"); kib >= 0 {
		return kib / 1024
	}
	return -1
}

// procStatusKiB is the kB figure key has in /proc/pid/status, or -1.
func procStatusKiB(pid int, key string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, key+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				return -1
			}
			return kb
		}
	}
	return -1
}

func waitUp(url string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not up within %v", url, d)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePorts(n int) ([]int, error) {
	var out []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
