package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freePort returns a port that was free a moment ago on 127.0.0.1.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// proc is a sluice subprocess.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// startSluice runs the sluice binary; the process is killed (if still running) and reaped when
// the test ends, and its output shown if the test failed.
func startSluice(t *testing.T, args ...string) *proc {
	t.Helper()
	if buildErr != nil {
		t.Fatalf("sluice binary: %v", buildErr)
	}
	p := &proc{out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(sluiceBin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true")
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("sluice %s output:\n%s", args[0], p.out.String())
		}
	})
	return p
}

// wait waits (boundedly) for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("process did not exit within %v", d)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("wait: %v", p.err)
	}
	return 0
}

// waitOK polls url until it answers 200 (bounded).
func waitOK(t *testing.T, hc *http.Client, url string, p *proc) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("process exited before %s answered: %v\n%s", url, p.err, p.out.String())
		default:
		}
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within 15s (last: %v)", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startMock runs `sluice mock` with the given inter-token latency and returns its base URL.
func startMock(t *testing.T, hc *http.Client, itl time.Duration) string {
	t.Helper()
	addr := freePort(t)
	p := startSluice(t, "mock", "--listen", addr, "--itl", itl.String())
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		p.wait(t, 10*time.Second)
	})
	url := "http://" + addr
	waitOK(t, hc, url+"/health", p)
	return url
}

// openStream starts a chat stream of n tokens (or with the given body) and returns a reader
// of its events.
func openStream(t *testing.T, hc *http.Client, addr string, n int, custom ...string) (*http.Response, *bufio.Reader) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"sim-llama","stream":true,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"count"}]}`, n)
	if len(custom) > 0 {
		body = custom[0]
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	return resp, bufio.NewReader(resp.Body)
}

// readEvents reads n events (stopping early at the end of the body).
func readEvents(t *testing.T, r *bufio.Reader, n int) []sseEvent {
	t.Helper()
	var raw strings.Builder
	got := 0
	for got < n {
		line, err := r.ReadString('\n')
		raw.WriteString(line)
		if line == "\n" {
			got++
		}
		if err != nil {
			break
		}
	}
	return parseSSE([]byte(raw.String()))
}

// TestSIGTERMDrainsStream: SIGTERM lets an in-flight stream finish with every token and
// [DONE], refuses new connections, and the process exits 0.
func TestSIGTERMDrainsStream(t *testing.T) {
	t.Parallel()
	hc := newHTTPClient(t)
	// 40 tokens at 30ms: about 1.2s of stream.
	mock := startMock(t, hc, 30*time.Millisecond)
	listen, admin := freePort(t), freePort(t)
	gw := startSluice(t, "serve", "--upstream", mock, "--listen", listen, "--admin", admin, "--log-level", "debug")
	waitOK(t, hc, "http://"+admin+"/readyz", gw)

	_, r := openStream(t, hc, listen, 40)
	first := readEvents(t, r, 3) // role chunk and two tokens: the stream is under way
	if len(first) != 3 {
		t.Fatalf("stream start: %+v", first)
	}
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// New connections are refused once the drain has begun (the admin listener stays up
	// and says not ready).
	eventually(t, 10*time.Second, "gateway listener closed", func() bool {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	if resp, err := hc.Get("http://" + admin + "/readyz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("/readyz while draining = %d, want 503", resp.StatusCode)
		}
	}

	rest := readEvents(t, r, 1000)
	all := append(first, rest...)
	text, done, chunks := streamText(t, all)
	if !done {
		t.Fatalf("the drained stream did not end with [DONE]: %d events, last %+v", len(all), all[len(all)-1])
	}
	for _, ev := range all {
		if ev.name == "error" {
			t.Fatalf("the drained stream carries an error event: %s", ev.data)
		}
	}
	if chunks != 40 || len(strings.Fields(text)) != 40 {
		t.Errorf("got %d token chunks (%d words), want 40: %q", chunks, len(strings.Fields(text)), text)
	}
	if code := gw.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("gateway exit code %d, want 0", code)
	}
	if _, err := net.DialTimeout("tcp", listen, time.Second); err == nil {
		t.Error("the gateway port still accepts connections after exit")
	}
}

// TestSIGTERMDrainDeadline: a stream still running when drain_timeout passes is ended with an
// SSE error event, and the process still exits 0.
func TestSIGTERMDrainDeadline(t *testing.T) {
	t.Parallel()
	hc := newHTTPClient(t)
	// 400 tokens at 20ms: 8s of stream, far past the 300ms drain deadline.
	mock := startMock(t, hc, 20*time.Millisecond)
	listen, admin := freePort(t), freePort(t)
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	writeFileAtomic(t, cfg, fmt.Sprintf(`listen: %s
admin: {listen: %s}
drain_timeout: 300ms
clusters:
  - {name: main, endpoints: [{url: %s}]}
routes:
  - {name: all, cluster: main}
`, listen, admin, mock))
	gw := startSluice(t, "serve", "--config", cfg)
	waitOK(t, hc, "http://"+admin+"/readyz", gw)

	_, r := openStream(t, hc, listen, 400)
	if first := readEvents(t, r, 3); len(first) != 3 {
		t.Fatalf("stream start: %+v", first)
	}
	start := time.Now()
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest := readEvents(t, r, 1000)
	if len(rest) == 0 {
		t.Fatal("stream ended with no event after SIGTERM")
	}
	last := rest[len(rest)-1]
	if last.name != "error" {
		t.Fatalf("stream cut by the drain deadline ended with %+v after %v, want an error event", last, time.Since(start))
	}
	checkErrorJSON(t, []byte(last.data), "shutdown")
	if _, done, chunks := streamText(t, rest[:len(rest)-1]); done || chunks >= 398 {
		t.Errorf("the stream ran to completion (%d chunks, done %v) despite the drain deadline", chunks, done)
	}
	if code := gw.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("gateway exit code %d, want 0", code)
	}
}
