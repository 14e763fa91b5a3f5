// Package rlstest starts the outside parts of a global rate limit for tests: Redis (Debian's
// redis-server) and Envoy's rate limit service (github.com/envoyproxy/ratelimit, built from
// the Go module proxy by the module in rls/, so that its dependencies stay out of Sluice's
// go.mod). Each is a child process in a temporary directory on free 127.0.0.1 ports (below
// the kernel's ephemeral range: freePorts), stopped when its test ends (and killed by the
// kernel if the test process dies, on Linux).
//
// Without redis-server a test skips, or fails when SLUICE_REQUIRE_TOOLS=1 (as CI sets it).
// The service is built once per test binary: minutes on a clean Go build cache, about a
// second afterwards (.ci/run builds it first, on its own).
//
// The service counts in fixed windows of a limit's unit (the calendar minute for "minute"):
// InOneWindow runs a budget phase again when it straddled a boundary, and Budgets reads the
// budgets of a config in the shape the fleet tests use.
package rlstest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	startTries   = 3                // a free port taken between picking and binding: pick again
	readyTimeout = 20 * time.Second // a process's wait to answer
	stopTimeout  = 5 * time.Second  // SIGTERM, then SIGKILL
)

// errPortTaken says a child exited because a port picked free was taken meanwhile.
var errPortTaken = errors.New("port taken")

// RequireTool returns the path of command name, or skips t without it (fails instead when
// SLUICE_REQUIRE_TOOLS=1); install says how to get it.
func RequireTool(t testing.TB, name, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		msg := fmt.Sprintf("%s not found (%s): %v", name, install, err)
		if os.Getenv("SLUICE_REQUIRE_TOOLS") == "1" {
			t.Fatalf("%s; SLUICE_REQUIRE_TOOLS=1 makes this a failure", msg)
		}
		t.Skipf("%s; set SLUICE_REQUIRE_TOOLS=1 to fail instead of skipping", msg)
	}
	return p
}

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment ago (bound, then
// closed). Another process may take one before the child binds it: the starters retry. They
// are picked below the kernel's ephemeral range where it can be read: a child restarted on its
// port (Redis.Restart, Service.Restart) must find it free, and while the child was down a
// port of the ephemeral range may have become the source port of any connection the test
// makes (a gateway's to the service, the service's to Redis), which no retry outlasts.
func freePorts(n int) ([]int, error) {
	lo, hi, ok := belowEphemeral()
	ports := make([]int, 0, n)
	var lis []net.Listener
	defer func() {
		for _, l := range lis {
			_ = l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		addr := "127.0.0.1:0"
		if ok && tries < 200 {
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(lo+rand.IntN(hi-lo+1)))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr != "127.0.0.1:0" {
				continue // taken: another
			}
			return nil, fmt.Errorf("free port: %w", err)
		}
		lis = append(lis, l) // held until all are picked: distinct
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// belowEphemeral is a range of ports under the kernel's ephemeral ones (Linux's
// ip_local_port_range), ok false when it cannot be read or leaves too little room.
func belowEphemeral() (lo, hi int, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, false
	}
	first, err := strconv.Atoi(f[0])
	if err != nil || first-1 < 10000+1024 {
		return 0, 0, false
	}
	return max(1024, first-1-15000), first - 1, true
}

// LogBuffer is a goroutine-safe sink for a child's (or a gateway's) output, kept for the
// failure log; it keeps the first MiB.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 { // bounded: the head says why a child failed
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *LogBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a child process; its goroutine waits for it and closes done.
type proc struct {
	name  string
	cmd   *exec.Cmd
	out   *LogBuffer
	since int // out's length when this process started
	done  chan struct{}
	err   error // Wait's, once done is closed
}

// startProc starts bin with exactly env (nothing inherited), its output appended to out.
func startProc(name, dir string, env []string, out *LogBuffer, bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Env = dir, append([]string{}, env...) // never nil: nil would inherit
	cmd.Stdout, cmd.Stderr = out, out
	dieWithTest(cmd)
	p := &proc{name: name, cmd: cmd, out: out, since: out.Len(), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// output is what this process wrote (out holds earlier runs' too).
func (p *proc) output() string { return p.out.String()[p.since:] }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill ends the process at once (SIGKILL, as a crash) and waits for it.
func (p *proc) kill() {
	if !p.exited() {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

// stop asks the process to exit (SIGTERM), and kills it after stopTimeout.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.kill()
	}
}

// portTaken reports whether a child that exited early did so because its port was taken.
func portTaken(out string) bool {
	return strings.Contains(strings.ToLower(out), "address already in use")
}
