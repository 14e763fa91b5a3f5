package rlstest

import (
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStartersReportTakenPorts: when a port picked free is taken before the child binds it,
// Redis and the rate limit service exit, and their starters say so (errPortTaken), which
// makes StartRedis and Start pick other ports. The service's debug port is the exception: it
// only logs that it could not listen there, and serves (the tests never use that port).
func TestStartersReportTakenPorts(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taken.Close() }()
	port := taken.Addr().(*net.TCPAddr).Port

	redis := StartRedis(t) // skips without redis-server
	t.Run("redis-server", func(t *testing.T) {
		r := &Redis{bin: redis.bin, dir: t.TempDir(), port: port}
		defer r.Stop()
		if err := r.start(); !errors.Is(err, errPortTaken) {
			t.Errorf("start on a taken port: %v, want errPortTaken\n%s", err, r.Logs())
		}
	})
	t.Run("ratelimit", func(t *testing.T) {
		s := Start(t, []byte("domain: "+Domain+"\n"), redis.Addr())
		for _, tc := range []struct {
			name  string
			port  *int
			fatal bool
		}{{"gRPC", &s.grpcPort, true}, {"HTTP", &s.httpPort, true}, {"debug", &s.debug, false}} {
			s.Stop()
			saved := *tc.port
			*tc.port = port
			err := s.start()
			if tc.fatal && !errors.Is(err, errPortTaken) || !tc.fatal && err != nil {
				t.Errorf("start with its %s port taken: %v, want errPortTaken: %v\n%s", tc.name, err, tc.fatal, s.Logs())
			}
			*tc.port = saved
		}
	})
}

func TestSameWindow(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		start, end string
		want       bool
	}{
		{"2026-03-01T10:00:00Z", "2026-03-01T10:00:59.999Z", true},
		{"2026-03-01T10:00:59.9Z", "2026-03-01T10:01:00Z", false},
		{"2026-03-01T10:00:30Z", "2026-03-01T10:01:10Z", false},
		{"2026-03-01T10:00:30+01:00", "2026-03-01T09:00:45Z", true}, // the same instant's minute, whatever the zone
	} {
		if got := SameWindow(at(tc.start), at(tc.end), Window); got != tc.want {
			t.Errorf("SameWindow(%s, %s) = %v, want %v", tc.start, tc.end, got, tc.want)
		}
	}
}

func TestBudgets(t *testing.T) {
	got := Budgets(t, []byte(`domain: sluice
descriptors:
  - key: budget
    value: requests
    descriptors: [{key: tenant, rate_limit: {unit: minute, requests_per_unit: 150}}]
  - key: budget
    value: tokens
    descriptors: [{key: tenant, rate_limit: {unit: minute, requests_per_unit: 15000}}]
`))
	if len(got) != 2 || got["requests"] != 150 || got["tokens"] != 15000 {
		t.Errorf("Budgets = %v, want requests 150, tokens 15000", got)
	}
}

// TestFreePortsBelowEphemeral: the ports a child is started on are distinct, free, and below
// the kernel's ephemeral range when it can be read, so that no connection's source port takes
// one while its child restarts (the fleet suite's "redis restarts" found its port taken).
func TestFreePortsBelowEphemeral(t *testing.T) {
	ports, err := freePorts(8)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi, ok := belowEphemeral()
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Errorf("port %d twice in %v", p, ports)
		}
		seen[p] = true
		if ok && (p < lo || p > hi) {
			t.Errorf("port %d outside %d..%d, below the ephemeral range", p, lo, hi)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d not free: %v", p, err)
			continue
		}
		_ = l.Close()
	}
	if _, err := os.Stat("/proc/sys/net/ipv4/ip_local_port_range"); err == nil && !ok {
		t.Error("the ephemeral range is readable but not used")
	}
}
