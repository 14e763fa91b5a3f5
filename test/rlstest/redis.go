package rlstest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"
)

// Redis is redis-server on 127.0.0.1 with no persistence (no RDB, no AOF), in its own
// temporary directory.
type Redis struct {
	bin, dir string
	port     int
	out      LogBuffer // every run's output
	p        *proc
}

// StartRedis starts Redis on a free port, stopped when t ends, or skips t without
// redis-server (fails when SLUICE_REQUIRE_TOOLS=1).
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	r := &Redis{bin: RequireTool(t, "redis-server", "apt-get install redis-server"), dir: t.TempDir()}
	var last error
	for range startTries {
		ports, err := freePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		r.port = ports[0]
		if last = r.start(); last == nil {
			t.Cleanup(r.Stop)
			return r
		}
		if !errors.Is(last, errPortTaken) {
			break
		}
	}
	t.Fatalf("redis-server: %v", last)
	return nil
}

// Addr is Redis's host:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// start runs redis-server on r.port and waits until it answers PING.
func (r *Redis) start() error {
	p, err := startProc("redis-server", r.dir, nil, &r.out, r.bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(r.port), "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no", "--logfile", "")
	if err != nil {
		return err
	}
	r.p = p
	deadline := time.Now().Add(readyTimeout)
	for {
		if ping(r.Addr()) == nil {
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

// Restart starts Redis again on the same port, empty (it keeps nothing on disk).
func (r *Redis) Restart(t testing.TB) {
	t.Helper()
	r.Stop()
	if err := r.start(); err != nil {
		t.Fatalf("redis-server restart on port %d: %v", r.port, err)
	}
}

// Kill ends Redis at once (SIGKILL, as a crash) and waits for it.
func (r *Redis) Kill() { r.p.kill() }

// Stop asks Redis to exit (SIGTERM), and kills it after 5s.
func (r *Redis) Stop() {
	if r.p != nil {
		r.p.stop()
	}
}

// Logs are Redis's output so far (every run's), for a failure message.
func (r *Redis) Logs() string { return r.out.String() }

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
