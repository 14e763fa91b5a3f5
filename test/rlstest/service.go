package rlstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Domain is the rate limit domain every config of the tests uses (the ratelimit policy's
// default); Start writes the config as this domain's.
const Domain = "sluice"

// buildTimeout bounds building the service on a clean cache.
const buildTimeout = 15 * time.Minute

// binary is the rate limit service's command, built once per test binary.
var binary struct {
	once sync.Once
	path string
	err  error
}

// Build returns the path of github.com/envoyproxy/ratelimit's service_cmd, the tool of the
// module in rls/ (its own go.mod and go.sum, at the version they pin): `go tool -n` builds it
// into the Go build cache once (minutes, from the module proxy, on a clean cache) and prints
// the cached executable's path (about a second afterwards).
func Build(t testing.TB) string {
	t.Helper()
	binary.once.Do(func() { binary.path, binary.err = build() })
	if binary.err != nil {
		t.Fatal(binary.err)
	}
	return binary.path
}

func build() (string, error) {
	goBin, err := goCommand()
	if err != nil {
		return "", err
	}
	dir, err := moduleDir(goBin)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
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
		return "", fmt.Errorf("go tool -n service_cmd in %s: %v\n%s", dir, err, stderr.String())
	}
	p := strings.TrimSpace(string(out))
	if fi, err := os.Stat(p); err != nil || fi.IsDir() {
		return "", fmt.Errorf("go tool -n service_cmd printed %q, not an executable (%v)", p, err)
	}
	return p, nil
}

// moduleDir is the directory of the module in rls/, next to this file: found from this
// file's path, or (a binary built with -trimpath) from the go command, which finds this
// package from the test's directory inside Sluice's module.
func moduleDir(goBin string) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		dir := filepath.Join(filepath.Dir(file), "rls")
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
	}
	out, err := exec.Command(goBin, "list", "-f", "{{.Dir}}", "github.com/sluicegw/sluice/test/rlstest").Output()
	if err != nil {
		return "", fmt.Errorf("finding test/rlstest/rls: go list: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "rls")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("finding test/rlstest/rls: %w", err)
	}
	return dir, nil
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

// Service is Envoy's rate limit service with one config file, backed by Redis.
type Service struct {
	bin, dir                  string
	redis                     string
	grpcPort, httpPort, debug int
	out                       LogBuffer // every run's output
	p                         *proc
}

// Start builds (once) and starts the rate limit service on free ports, stopped when t ends,
// with config (the YAML of domain Domain, written as
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/sluice.yaml) and Redis at redisAddr, and waits
// until it answers ShouldRateLimit.
func Start(t testing.TB, config []byte, redisAddr string) *Service {
	t.Helper()
	s := &Service{bin: Build(t), dir: t.TempDir(), redis: redisAddr}
	conf := filepath.Join(s.dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, Domain+".yaml"), config, 0o644); err != nil {
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
			t.Cleanup(s.Stop)
			return s
		}
		if !errors.Is(last, errPortTaken) {
			break
		}
	}
	t.Fatalf("ratelimit: %v", last)
	return nil
}

// Addr is the service's gRPC address (host:port, plaintext): the policy's global.address.
func (s *Service) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.grpcPort)) }

// env is the service's whole environment (nothing inherited): see its settings.go.
func (s *Service) env() []string {
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
func (s *Service) start() error {
	p, err := startProc("ratelimit", s.dir, s.env(), &s.out, s.bin)
	if err != nil {
		return err
	}
	s.p = p
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.kill()
		return err
	}
	defer func() { _ = conn.Close() }()
	client := rlsv3.NewRateLimitServiceClient(conn)
	probe := &rlsv3.RateLimitRequest{Domain: Domain, Descriptors: []*commonrl.RateLimitDescriptor{
		{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "rlstest_probe", Value: "ready"}}},
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

// Restart starts the service again on the same ports (the gateways' config names them).
func (s *Service) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		t.Fatalf("ratelimit restart on port %d: %v", s.grpcPort, err)
	}
}

// Kill ends the service at once (SIGKILL, as a crash) and waits for it.
func (s *Service) Kill() { s.p.kill() }

// Stop asks the service to exit (SIGTERM), and kills it after 5s.
func (s *Service) Stop() {
	if s.p != nil {
		s.p.stop()
	}
}

// Exited reports whether the service's process has ended, and how (Wait's error).
func (s *Service) Exited() (bool, error) {
	if s.p == nil || !s.p.exited() {
		return false, nil
	}
	return true, s.p.err
}

// Logs are the service's output so far (every run's), for a failure message.
func (s *Service) Logs() string { return s.out.String() }
