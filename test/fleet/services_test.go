package fleet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The outside parts the fleet tests run: Redis and Envoy's rate limit service, each a child
// process in a temporary directory on ephemeral 127.0.0.1 ports.

const (
	startTries   = 3                // a free port taken between picking and binding: pick again
	readyTimeout = 20 * time.Second // a process's wait to answer
	stopTimeout  = 5 * time.Second  // SIGTERM, then SIGKILL
)

// requireTool returns the path of command name, or skips the test without it (fails
// instead when SLUICE_REQUIRE_TOOLS=1).
func requireTool(t *testing.T, name, install string) string {
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

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment ago (listen on :0,
// then close). Another process may take one before the child binds it: the starters retry.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var lis []net.Listener
	defer func() {
		for _, l := range lis {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		lis = append(lis, l) // held until all are picked: distinct
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// syncBuffer is a goroutine-safe sink for a child's output, kept for the failure log.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 { // bounded: the head says why a child failed
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a child process; its goroutine waits for it and closes done.
type proc struct {
	name  string
	cmd   *exec.Cmd
	out   *syncBuffer
	since int // out's length when this process started
	done  chan struct{}
	err   error // Wait's, once done is closed
}

// startProc starts bin with exactly env (nothing inherited), its output appended to out.
func startProc(name, dir string, env []string, out *syncBuffer, bin string, args ...string) (*proc, error) {
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

// redisServer is redis-server on 127.0.0.1 with no persistence (no RDB, no AOF), in its own
// temporary directory.
type redisServer struct {
	bin, dir string
	port     int
	out      syncBuffer // every run's output
	p        *proc
}

// startRedis starts Redis on a free port, or skips the test without redis-server.
func startRedis(t *testing.T) *redisServer {
	t.Helper()
	r := &redisServer{bin: requireTool(t, "redis-server", "apt-get install redis-server"), dir: t.TempDir()}
	var last error
	for range startTries {
		ports, err := freePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		r.port = ports[0]
		if last = r.start(); last == nil {
			t.Cleanup(r.stop)
			return r
		}
		if !errors.Is(last, errPortTaken) {
			break
		}
	}
	t.Fatalf("redis-server: %v", last)
	return nil
}

var errPortTaken = errors.New("port taken")

func (r *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// start runs redis-server on r.port and waits until it answers PING.
func (r *redisServer) start() error {
	p, err := startProc("redis-server", r.dir, nil, &r.out, r.bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(r.port), "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no", "--logfile", "")
	if err != nil {
		return err
	}
	r.p = p
	deadline := time.Now().Add(readyTimeout)
	for {
		if ping(r.addr()) == nil {
			return nil
		}
		if p.exited() {
			if portTaken(p.output()) {
				return fmt.Errorf("%w: %d", errPortTaken, r.port)
			}
			return fmt.Errorf("exited (%v):\n%s", p.err, p.output())
		}
		if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("not answering PING within %v:\n%s", readyTimeout, p.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// restart starts Redis again on the same port, empty (it keeps nothing on disk).
func (r *redisServer) restart(t *testing.T) {
	t.Helper()
	r.stop()
	if err := r.start(); err != nil {
		t.Fatalf("redis-server restart on port %d: %v", r.port, err)
	}
}

func (r *redisServer) kill() { r.p.kill() }

func (r *redisServer) stop() {
	if r.p != nil {
		r.p.stop()
	}
}

// ping sends PING in RESP and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// rlsBinary is the rate limit service's command, built once per test binary.
var rlsBinary struct {
	once sync.Once
	path string
	err  error
}

// buildRLS returns the path of github.com/envoyproxy/ratelimit's service_cmd, the tool of
// the module in rls/ (its own go.mod and go.sum, at the version they pin): `go tool -n`
// builds it into the Go build cache once (minutes, from the module proxy, on a clean cache)
// and prints the cached executable's path (about a second afterwards).
func buildRLS(t *testing.T) string {
	t.Helper()
	rlsBinary.once.Do(func() {
		goBin, err := goCommand()
		if err != nil {
			rlsBinary.err = err
			return
		}
		dir, err := filepath.Abs("rls")
		if err != nil {
			rlsBinary.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goBin, "tool", "-n", "service_cmd")
		cmd.Dir = dir
		// The module's go.sum is authoritative (-mod=readonly: a test never rewrites it); no
		// workspace may replace its dependencies.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly -buildvcs=false", "GOWORK=off")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			rlsBinary.err = fmt.Errorf("go tool -n service_cmd in %s: %v\n%s", dir, err, stderr.String())
			return
		}
		p := strings.TrimSpace(string(out))
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			rlsBinary.err = fmt.Errorf("go tool -n service_cmd printed %q, not an executable (%v)", p, err)
			return
		}
		rlsBinary.path = p
	})
	if rlsBinary.err != nil {
		t.Fatal(rlsBinary.err)
	}
	return rlsBinary.path
}

// goCommand is the go command of the toolchain running the tests (go test puts its
// GOROOT/bin first on PATH).
func goCommand() (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("go command not found: %w", err)
	}
	if out, err := exec.Command(goBin, "env", "GOROOT").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "go")
		if _, err := os.Stat(p); err == nil {
			goBin = p
		}
	}
	return goBin, nil
}

// rlsServer is Envoy's rate limit service with one config file, backed by Redis.
type rlsServer struct {
	bin, dir                  string
	redis                     string
	grpcPort, httpPort, debug int
	out                       syncBuffer // every run's output
	p                         *proc
}

// rlsDomain is the domain every fleet test's config uses (the policy's default).
const rlsDomain = "sluice"

// startRLS starts the rate limit service on free ports with config (the YAML of one domain,
// written as RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/sluice.yaml) and redis at redisAddr,
// and waits until it answers ShouldRateLimit.
func startRLS(t *testing.T, config []byte, redisAddr string) *rlsServer {
	t.Helper()
	s := &rlsServer{bin: buildRLS(t), dir: t.TempDir(), redis: redisAddr}
	conf := filepath.Join(s.dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, rlsDomain+".yaml"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	var last error
	for range startTries {
		ports, err := freePorts(3)
		if err != nil {
			t.Fatal(err)
		}
		s.grpcPort, s.httpPort, s.debug = ports[0], ports[1], ports[2]
		if last = s.start(); last == nil {
			t.Cleanup(s.stop)
			return s
		}
		if !errors.Is(last, errPortTaken) {
			break
		}
	}
	t.Fatalf("ratelimit: %v", last)
	return nil
}

func (s *rlsServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.grpcPort)) }

// env is the service's whole environment (nothing inherited): see its settings.go.
func (s *rlsServer) env() []string {
	return []string{
		"USE_STATSD=false", "DISABLE_STATS=true",
		"LOG_LEVEL=warn", "LOG_FORMAT=text",
		"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL=" + s.redis,
		"REDIS_TIMEOUT=1s",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(s.grpcPort),
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(s.httpPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(s.debug),
		"RUNTIME_ROOT=" + filepath.Join(s.dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
	}
}

// start runs the service on s's ports and waits until it answers a ShouldRateLimit for a
// descriptor no limit matches (OK: its config is loaded and its gRPC server up).
func (s *rlsServer) start() error {
	p, err := startProc("ratelimit", s.dir, s.env(), &s.out, s.bin)
	if err != nil {
		return err
	}
	s.p = p
	conn, err := grpc.NewClient(s.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.kill()
		return err
	}
	defer func() { _ = conn.Close() }()
	client := rlsv3.NewRateLimitServiceClient(conn)
	probe := &rlsv3.RateLimitRequest{Domain: rlsDomain, Descriptors: []*commonrl.RateLimitDescriptor{
		{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "fleet_test_probe", Value: "ready"}}},
	}}
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := client.ShouldRateLimit(ctx, probe)
		cancel()
		if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			return nil
		}
		if p.exited() {
			if portTaken(p.output()) {
				return fmt.Errorf("%w: %d, %d or %d", errPortTaken, s.grpcPort, s.httpPort, s.debug)
			}
			return fmt.Errorf("exited (%v):\n%s", p.err, p.output())
		}
		if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("not answering within %v (last: %v, %v):\n%s", readyTimeout, resp, err, p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restart starts the service again on the same ports (the gateways' config names them).
func (s *rlsServer) restart(t *testing.T) {
	t.Helper()
	s.stop()
	if err := s.start(); err != nil {
		t.Fatalf("ratelimit restart on port %d: %v", s.grpcPort, err)
	}
}

func (s *rlsServer) kill() { s.p.kill() }

func (s *rlsServer) stop() {
	if s.p != nil {
		s.p.stop()
	}
}

// logs are the service's output so far, for a failure message.
func (s *rlsServer) logs() string { return s.out.String() }

// logs are Redis's output so far, for a failure message.
func (r *redisServer) logs() string { return r.out.String() }

// TestStartersReportTakenPorts: when a port picked free is taken before the child binds it,
// Redis and the rate limit service exit, and their starters say so (errPortTaken), which
// makes startRedis and startRLS pick other ports. The service's debug port is the exception:
// it only logs that it could not listen there, and serves (the tests never use that port).
func TestStartersReportTakenPorts(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taken.Close() }()
	port := taken.Addr().(*net.TCPAddr).Port

	redis := startRedis(t) // skips without redis-server
	t.Run("redis-server", func(t *testing.T) {
		r := &redisServer{bin: redis.bin, dir: t.TempDir(), port: port}
		defer r.stop()
		if err := r.start(); !errors.Is(err, errPortTaken) {
			t.Errorf("start on a taken port: %v, want errPortTaken\n%s", err, r.logs())
		}
	})
	t.Run("ratelimit", func(t *testing.T) {
		s := startRLS(t, []byte("domain: "+rlsDomain+"\n"), redis.addr())
		for _, tc := range []struct {
			name  string
			port  *int
			fatal bool
		}{{"gRPC", &s.grpcPort, true}, {"HTTP", &s.httpPort, true}, {"debug", &s.debug, false}} {
			s.stop()
			saved := *tc.port
			*tc.port = port
			err := s.start()
			if tc.fatal && !errors.Is(err, errPortTaken) || !tc.fatal && err != nil {
				t.Errorf("start with its %s port taken: %v, want errPortTaken: %v\n%s", tc.name, err, tc.fatal, s.logs())
			}
			*tc.port = saved
		}
	})
}
