// Package pgtest starts throwaway PostgreSQL servers for tests: a cluster made by initdb in
// a temporary directory, served by pg_ctl on an ephemeral 127.0.0.1 port (its unix socket
// in the same directory), stopped and removed when the test ends.
//
// The binaries (initdb, pg_ctl, postgres) are looked up on PATH, then in Debian's
// /usr/lib/postgresql/*/bin (apt-get install postgresql). Without them a test skips, or
// fails when SLUICE_REQUIRE_TOOLS=1 (as CI sets it). PostgreSQL refuses to run as root: as
// root the server runs as the user "postgres" (Debian's package makes it) or, without one,
// "nobody".
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is one running throwaway cluster.
type Server struct {
	bin     string // the directory of initdb and pg_ctl
	dir     string // everything: the data, the socket, the log
	data    string
	sock    string
	log     string
	port    int
	as      *account // the user the server runs as, when the test runs as root
	running bool
}

type account struct {
	name     string
	uid, gid uint32
}

// Bin returns the directory holding initdb and pg_ctl, or skips t without them (fails when
// SLUICE_REQUIRE_TOOLS=1).
func Bin(t testing.TB) string {
	t.Helper()
	dir, err := findBin()
	if err != nil {
		missing(t, err)
	}
	return dir
}

func missing(t testing.TB, err error) {
	t.Helper()
	msg := fmt.Sprintf("PostgreSQL: %v (install Debian's postgresql package)", err)
	if os.Getenv("SLUICE_REQUIRE_TOOLS") == "1" {
		t.Fatalf("%s; SLUICE_REQUIRE_TOOLS=1 makes this a failure", msg)
	}
	t.Skipf("%s; set SLUICE_REQUIRE_TOOLS=1 to fail instead of skipping", msg)
}

func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	for _, p := range found {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("initdb and pg_ctl not found on PATH or in /usr/lib/postgresql/*/bin")
}

// version is the major version in a path /usr/lib/postgresql/N/bin/initdb.
func version(p string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return n
}

// Start makes and starts a cluster; it is stopped and removed when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Bin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Launch(ctx, bin)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Launch makes and starts a cluster with the binaries in bin (Bin); Close stops and
// removes it.
func Launch(ctx context.Context, bin string) (_ *Server, err error) {
	s := &Server{bin: bin}
	if os.Geteuid() == 0 {
		if s.as, err = unprivileged(); err != nil {
			return nil, fmt.Errorf("running as root, and %w", err)
		}
	}
	// A short path of its own (a unix socket's path is bounded to about 100 bytes), which
	// the unprivileged user can reach when the test runs as root.
	if s.dir, err = os.MkdirTemp("", "pg"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.data, s.sock, s.log = filepath.Join(s.dir, "data"), filepath.Join(s.dir, "run"), filepath.Join(s.dir, "run", "server.log")
	for _, d := range []string{s.data, s.sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	if s.as != nil {
		err := os.Chmod(s.dir, 0o755)
		for _, d := range []string{s.data, s.sock} {
			err = errors.Join(err, os.Chown(d, int(s.as.uid), int(s.as.gid)))
		}
		if err != nil {
			return nil, fmt.Errorf("handing the directory to %s: %w", s.as.name, err)
		}
	}
	if out, err := s.command(ctx, "initdb", "-D", s.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "-N").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	// An ephemeral port: free when asked, and taken again in the rare case it is not.
	var last error
	for range 3 {
		if s.port, last = freePort(); last != nil {
			continue
		}
		if last = s.start(ctx); last == nil {
			return s, nil
		}
	}
	return nil, last
}

// Close stops the server at once and removes its directory.
func (s *Server) Close() {
	if s.running {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = s.ctl(ctx, "-m", "immediate", "-w", "-t", "60", "stop")
		s.running = false
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// unprivileged finds the user a server started by root runs as.
func unprivileged() (*account, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 == nil && err2 == nil && uid != 0 {
			return &account{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
		}
	}
	return nil, errors.New("no user postgres or nobody to run PostgreSQL as (it refuses root)")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// command is one of the cluster's binaries, run as the server's user.
func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PG") && !strings.HasPrefix(e, "LC_") && !strings.HasPrefix(e, "LANG=") && !strings.HasPrefix(e, "HOME=") {
			env = append(env, e)
		}
	}
	cmd.Env = append(env, "LC_ALL=C", "HOME="+s.dir)
	if s.as != nil {
		runAs(cmd, s.as.uid, s.as.gid)
	}
	return cmd
}

func (s *Server) ctl(ctx context.Context, args ...string) error {
	out, err := s.command(ctx, "pg_ctl", append([]string{"-D", s.data}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (s *Server) start(ctx context.Context) error {
	opts := fmt.Sprintf("-p %d -k '%s' -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100 -c shared_buffers=16MB",
		s.port, s.sock)
	if err := s.ctl(ctx, "-l", s.log, "-w", "-t", "60", "-o", opts, "start"); err != nil {
		b, _ := os.ReadFile(s.log)
		return fmt.Errorf("%w\nserver log:\n%s", err, tail(b, 4000))
	}
	s.running = true
	return nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Port is the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// URL is the postgres:// URL of database db (as user postgres, no password, no TLS).
func (s *Server) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// CreateDB creates database name and returns its URL.
func (s *Server) CreateDB(t testing.TB, name string) string {
	t.Helper()
	u, err := s.createDB(name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

func (s *Server) createDB(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return s.URL(name), nil
}

// Shared is one server for the tests of a package, started when a test first asks for a
// database; the package's TestMain closes it after m.Run.
type Shared struct {
	once sync.Once
	s    *Server
	err  error
	n    atomic.Int64
}

// DB returns the URL of a new, empty database on the shared server (starting it the first
// time), or skips t without PostgreSQL (fails when SLUICE_REQUIRE_TOOLS=1).
func (sh *Shared) DB(t testing.TB) string {
	t.Helper()
	bin := Bin(t)
	sh.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		sh.s, sh.err = Launch(ctx, bin)
	})
	if sh.err != nil {
		t.Fatalf("pgtest: %v", sh.err)
	}
	u, err := sh.s.createDB(fmt.Sprintf("t%d", sh.n.Add(1)))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

// Close stops the shared server, if it was started.
func (sh *Shared) Close() {
	if sh.s != nil {
		sh.s.Close()
	}
}

// Stop stops the server (fast: open connections are cut), as a database that goes away.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.ctl(ctx, "-m", "fast", "-w", "-t", "60", "stop"); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	s.running = false
}

// Restart starts a stopped server again on its port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.start(ctx); err != nil {
		t.Fatalf("pgtest: restart: %v", err)
	}
}
