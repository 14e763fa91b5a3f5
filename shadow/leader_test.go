package shadow

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestLeaderSQLite: a SQLite store is one host's: its Leader always leads.
func TestLeaderSQLite(t *testing.T) {
	st := mustOpen(t, filepath.Join(t.TempDir(), "shadow.db"))
	a, b := st.Leader(ProgressionLock), st.Leader(ProgressionLock)
	for i, l := range []*Leader{a, b, a} {
		if ok, err := l.Try(context.Background()); !ok || err != nil || !l.Held() {
			t.Fatalf("try %d: %v, %v: a SQLite store's Leader leads", i, ok, err)
		}
	}
	a.Release()
	b.Release()
}

// TestLeaderPostgres: of two stores on one database one leads at a time; the lock is held
// across tries, given up by Release and lost when its session is cut, and then the other
// takes it.
func TestLeaderPostgres(t *testing.T) {
	u := pgShared.DB(t)
	ctx := context.Background()
	sa, sb := mustOpen(t, u), mustOpen(t, u)
	a, b := sa.Leader(ProgressionLock), sb.Leader(ProgressionLock)
	defer a.Release()
	defer b.Release()
	try := func(l *Leader, name string, want bool) {
		t.Helper()
		ok, err := l.Try(ctx)
		if err != nil || ok != want || l.Held() != want {
			t.Fatalf("%s: Try = %v, %v (held %v), want %v", name, ok, err, l.Held(), want)
		}
	}
	// within bounds: another session's end is seen by the server a moment later
	eventually := func(l *Leader, name string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ok, err := l.Try(ctx)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not the leader within 10s", name)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	try(a, "a first", true)
	try(b, "b while a leads", false)
	try(a, "a again", true)
	try(b, "b again", false)
	if n := advisoryHolders(t, u); n != 1 {
		t.Fatalf("%d sessions hold an advisory lock, want 1 (a's, taken once)", n)
	}

	a.Release()
	eventually(b, "b after a released")
	try(a, "a while b leads", false)

	// b's session is cut (the database restarted it, the network dropped it): b has lost
	// the lock, a takes it, and b's next Try says it is not the leader.
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
		t.Fatal(err)
	}
	eventually(a, "a after b's session was cut")
	try(b, "b after its session was cut", false)
	try(a, "a still", true)

	// The lock of another key is another's.
	other := sb.Leader(ProgressionLock + 1)
	defer other.Release()
	try(other, "another key", true)
}

// advisoryHolders counts the sessions holding an advisory lock on the database of u.
func advisoryHolders(t *testing.T, u string) int {
	t.Helper()
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
