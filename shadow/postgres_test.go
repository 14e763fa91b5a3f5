package shadow

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/test/pgtest"
)

func TestRebind(t *testing.T) {
	tests := []struct {
		d       dialect
		in, out string
	}{
		{sqliteDialect, "SELECT a FROM t WHERE b = ? AND c = ?", "SELECT a FROM t WHERE b = ? AND c = ?"},
		{postgresDialect, "SELECT a FROM t WHERE b = ? AND c = ?", "SELECT a FROM t WHERE b = $1 AND c = $2"},
		{postgresDialect, "SELECT 1", "SELECT 1"},
		{postgresDialect, strings.Repeat("?,", 11) + "?", "$1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12"},
	}
	for _, tt := range tests {
		if got := tt.d.rebind(tt.in); got != tt.out {
			t.Errorf("%s rebind(%q) = %q, want %q", tt.d.name, tt.in, got, tt.out)
		}
	}
}

func TestPostgresArgs(t *testing.T) {
	in := []any{"plain", "nul\x00inside", "bad \xff utf-8", 42, nil, []byte("\x00")}
	got := postgresDialect.args(in)
	want := []any{"plain", "nul\uFFFDinside", "bad \uFFFD utf-8", 42, nil, []byte("\x00")}
	for i := range want {
		if !equalArg(got[i], want[i]) {
			t.Errorf("arg %d: %q, want %q", i, got[i], want[i])
		}
	}
	if in[1] != "nul\x00inside" {
		t.Error("the caller's arguments were changed")
	}
	if s := sqliteDialect.args(in); s[1] != "nul\x00inside" {
		t.Error("SQLite's arguments were changed")
	}
}

func equalArg(a, b any) bool {
	if ab, ok := a.([]byte); ok {
		bb, ok := b.([]byte)
		return ok && string(ab) == string(bb)
	}
	return a == b
}

func TestRedactDSN(t *testing.T) {
	tests := []struct{ in, out string }{
		{"/var/lib/sluice/shadow.db", "/var/lib/sluice/shadow.db"},
		{"", ""},
		{"postgres://sluice@db:5432/shadow", "postgres://sluice@db:5432/shadow"},
		{"postgres://sluice:s3cr%40t@db:5432/shadow?sslmode=require", "postgres://sluice:xxxxx@db:5432/shadow?sslmode=require"},
		{"postgresql://db/shadow?user=u&password=hunter2", "postgresql://db/shadow?password=xxxxx&user=u"},
		{"POSTGRES://u:pw@db/x?sslpassword=k", "postgres://u:xxxxx@db/x?sslpassword=xxxxx"},
		{"postgres://u:pw@db:notaport/x", "postgres://[unparsable URL]"},
	}
	for _, tt := range tests {
		if got := RedactDSN(tt.in); got != tt.out {
			t.Errorf("RedactDSN(%q) = %q, want %q", tt.in, got, tt.out)
		}
	}
}

func TestCheckPostgresURL(t *testing.T) {
	tests := []struct {
		in      string
		problem string // "" when valid
	}{
		{"postgres://sluice@db.internal:5432/shadow?sslmode=verify-full", ""},
		{"postgresql://sluice:pw@127.0.0.1/shadow?connect_timeout=3&application_name=gw", ""},
		{"postgres:///shadow?host=/var/run/postgresql", ""},
		{"/var/lib/shadow.db", "not a postgres"},
		{"postgres://u:topsecret@db/x?sslmode=sometimes", "sslmode"},
		{"postgres://u:topsecret@db:99999999/x", "port"},
		{"postgres://u:topsecret@db/x?connect_timeout=soon", "connect_timeout"},
		{"postgres://u:topsecret@db/x#frag", "fragment"},
		{"postgres://u:topsecret@db:port/x", "not a URL"},
	}
	for _, tt := range tests {
		err := CheckPostgresURL(tt.in)
		switch {
		case tt.problem == "" && err != nil:
			t.Errorf("%q: %v", tt.in, err)
		case tt.problem != "" && (err == nil || !strings.Contains(err.Error(), tt.problem)):
			t.Errorf("%q: got %v, want a problem with %q", tt.in, err, tt.problem)
		case err != nil && strings.Contains(err.Error(), "topsecret"):
			t.Errorf("%q: the password is in the error: %v", tt.in, err)
		}
	}
}

// TestPostgresMigratesOnce: gateways starting together on a new database all open it; the
// schema is created once, with one version row and one session key they share.
func TestPostgresMigratesOnce(t *testing.T) {
	u := pgShared.DB(t)
	ctx := context.Background()
	const n = 8
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { stores[i], errs[i] = OpenStore(ctx, u) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	h := stores[0].SessionHash("alice")
	for i, s := range stores {
		if s.SessionHash("alice") != h {
			t.Fatalf("store %d hashes sessions with another key", i)
		}
		if !s.Shared() || s.Kind() != "postgres" {
			t.Fatalf("store %d: shared %v, kind %q", i, s.Shared(), s.Kind())
		}
	}
	var versions, version, keys int
	c := stores[0].c()
	if err := c.queryRow(ctx, `SELECT COUNT(*), MAX(version) FROM schema_version`).Scan(&versions, &version); err != nil || versions != 1 || version != SchemaVersion {
		t.Fatalf("%d version rows, version %d, %v", versions, version, err)
	}
	if err := c.queryRow(ctx, `SELECT COUNT(*) FROM meta`).Scan(&keys); err != nil || keys != 1 {
		t.Fatalf("%d session keys, %v", keys, err)
	}
	if len(pgMigrations) != SchemaVersion {
		t.Fatalf("%d PostgreSQL migrations for schema version %d", len(pgMigrations), SchemaVersion)
	}
}

// TestPostgresRefusesNewerSchema: a database migrated by a newer binary is refused, not
// misread, by the gateway and by reports.
func TestPostgresRefusesNewerSchema(t *testing.T) {
	u := pgShared.DB(t)
	ctx := context.Background()
	s := mustOpen(t, u)
	if _, err := s.c().exec(ctx, `UPDATE schema_version SET version = ?`, SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenStore(ctx, u); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("open: %v", err)
	}
	if _, err := OpenStoreReadOnly(ctx, u); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("read-only open: %v", err)
	}
}

// TestPostgresText: what PostgreSQL's text cannot hold (NUL, invalid UTF-8) is stored as
// U+FFFD rather than refused.
func TestPostgresText(t *testing.T) {
	s := mustOpen(t, pgShared.DB(t))
	ctx := context.Background()
	p := testPair("chat", 1, time.Now(), false)
	p.Candidate.Text, p.RequestID = "a\x00b", "req-\xff"
	if err := s.AddPair(ctx, p); err != nil {
		t.Fatal(err)
	}
	ps, err := s.Pairs(ctx, "chat", 1)
	if err != nil || len(ps) != 1 || ps[0].Candidate.Text != "a\uFFFDb" || ps[0].RequestID != "req-\uFFFD" {
		t.Fatalf("%+v, %v", ps, err)
	}
}

// TestPostgresReport: `sluice shadow report --store postgres://…` reads the shared store
// read-only: the same report as from the gateways' own handle, judged over every
// instance's pairs; writes are refused.
func TestPostgresReport(t *testing.T) {
	u := pgShared.DB(t)
	ctx := context.Background()
	a, b := mustOpen(t, u), mustOpen(t, u)
	t0 := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	for i := range 40 {
		st, inst := a, "gw-a"
		if i%2 == 1 {
			st, inst = b, "gw-b"
		}
		p := testPair("chat", i, t0.Add(time.Duration(i)*time.Second), i == 39)
		p.Instance = inst
		if err := st.AddPair(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.AddVerdict(ctx, VerdictRecord{Route: "chat", Instance: "gw-a", Time: t0.Add(time.Minute),
		Verdict: Verdict{Decision: Hold, Reason: "not decided", Evidence: []Evidence{}}, Pairs: 40}); err != nil {
		t.Fatal(err)
	}
	ro, err := OpenStoreReadOnly(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.AddPair(ctx, testPair("chat", 99, t0, false)); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("a read-only store took a write: %v", err)
	}
	in := []RouteInput{{Route: "chat", Window: 100}}
	got, err := BuildReport(ctx, ro, in)
	if err != nil {
		t.Fatal(err)
	}
	want, err := BuildReport(ctx, b, in)
	if err != nil {
		t.Fatal(err)
	}
	got.Generated, want.Generated = time.Time{}, time.Time{}
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if string(gj) != string(wj) {
		t.Fatalf("read-only report differs:\n got  %s\n want %s", gj, wj)
	}
	rr := got.Routes[0]
	if rr.Scope != ScopeFleet || len(rr.Sources) != 2 || rr.Sources[0] != (Source{"gw-a", 20}) || rr.Samples.StoredPairs != 40 ||
		rr.VerdictSource != SourceStored || len(rr.History) != 1 || rr.History[0].Instance != "gw-a" || rr.Samples.Candidate.Requests != 40 {
		t.Fatalf("route report %+v", rr)
	}
	var text strings.Builder
	if err := got.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "scope:    fleet: every instance's pairs in the shared store (2 instances: gw-a 20, gw-b 20)") ||
		!strings.Contains(text.String(), "2026-12-02T11:01:00Z by gw-a") {
		t.Fatalf("text report:\n%s", text.String())
	}
}

// TestPostgresWriterOutage: a gateway's writer keeps taking records, never waiting, while
// its database is down: it holds them up to its bound and counts the ones it drops; a
// writer started while the database is down opens it when it is back; both then write
// everything they held.
func TestPostgresWriterOutage(t *testing.T) {
	srv := pgtest.Start(t)
	u := srv.CreateDB(t, "shadow")
	open := func(ctx context.Context) (*Store, error) { return OpenStore(ctx, u) }
	p := testPair("chat", 1, time.Now(), false)
	p.Instance = "gw-1"
	cfg := WriterConfig{MaxBytes: 20 * pairSize(p), MinBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	w := StartWriter(open, cfg)
	defer closeWriter(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for range 10 {
		if !w.AddPair(p) {
			t.Fatal("pair refused with the database up")
		}
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if s := w.Stats(); !s.Opened || !s.Connected || s.Written != 10 {
		t.Fatalf("with the database up: %+v", s)
	}

	srv.Stop(t)
	late := StartWriter(open, cfg) // a gateway starting while the database is down
	defer closeWriter(t, late)
	taken := 0
	for range 50 {
		if w.AddPair(p) {
			taken++
		}
	}
	if !late.AddPair(p) {
		t.Fatal("the late writer refused its first pair")
	}
	waitFor(t, "the writers to find the database gone", func() bool {
		s, l := w.Stats(), late.Stats()
		return !s.Connected && s.Retries > 0 && l.Retries > 0
	})
	s := w.Stats()
	if taken != 20 || s.Buffered != 20 || s.Dropped[KindPair] != 30 || s.LastError == "" || s.DownSince.IsZero() {
		t.Fatalf("while down: took %d, %+v", taken, s)
	}
	if l := late.Stats(); l.Opened || l.Buffered != 1 {
		t.Fatalf("late writer while down: %+v", l)
	}

	srv.Restart(t)
	for _, wr := range []*Writer{w, late} {
		if err := wr.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s = w.Stats()
	if !s.Connected || s.Buffered != 0 || s.Written != 30 || !s.DownSince.IsZero() {
		t.Fatalf("after the restart: %+v", s)
	}
	if l := late.Stats(); !l.Opened || l.Written != 1 {
		t.Fatalf("late writer after the restart: %+v", l)
	}
	n, _, err := w.Store().Count(ctx, "chat")
	if err != nil || n != 31 {
		t.Fatalf("%d pairs stored, want 31: %v", n, err)
	}
}
