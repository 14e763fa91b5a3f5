package shadow

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// dialect is what differs between the store's two databases: SQLite (embedded, one
// replica's file or memory) and PostgreSQL (a server every replica of a fleet shares).
// Everything else (the columns, the queries, the scans, the restore) is one code path.
type dialect struct {
	name string // "sqlite" or "postgres"
	// dollar: placeholders are $1, $2, … (PostgreSQL) rather than ? (SQLite).
	dollar bool
	// noLimit is the LIMIT that means none, for a LIMIT … OFFSET ("-1" in SQLite, "ALL" in
	// PostgreSQL).
	noLimit string
	// tryLock takes a session-level advisory lock without waiting, answering whether it
	// did (PostgreSQL's pg_try_advisory_lock); "" where the database has none (SQLite: one
	// host's file, whose one control plane always leads: Leader).
	tryLock string
	// keepalive makes a session that holds a lock found dead within about half a minute
	// when its peer vanishes without closing it ("" for none): the server's TCP
	// keep-alives, which otherwise take hours, release the lock with the session.
	keepalive string
}

var (
	sqliteDialect   = dialect{name: "sqlite", noLimit: "-1"}
	postgresDialect = dialect{name: "postgres", dollar: true, noLimit: "ALL", tryLock: "SELECT pg_try_advisory_lock(?)",
		keepalive: "SELECT set_config('tcp_keepalives_idle', '10', false), set_config('tcp_keepalives_interval', '5', false), " +
			"set_config('tcp_keepalives_count', '3', false)"}
)

// rebind turns the ? placeholders of q into the dialect's. The store's queries have no ?
// anywhere else.
func (d dialect) rebind(q string) string {
	if !d.dollar || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] != '?' {
			b.WriteByte(q[i])
			continue
		}
		n++
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// args makes the arguments storable: PostgreSQL's text refuses NUL bytes and invalid
// UTF-8, which a model's answer or a request id may hold (SQLite keeps them as given); they
// become U+FFFD.
func (d dialect) args(args []any) []any {
	if !d.dollar {
		return args
	}
	out := make([]any, len(args))
	for i, a := range args {
		if s, ok := a.(string); ok {
			a = pgText(s)
		}
		out[i] = a
	}
	return out
}

func pgText(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	return s
}

// colType is the column type of a kind of value in the dialect.
func (d dialect) colType(kind string) string {
	if !d.dollar {
		return map[string]string{"int": "INTEGER", "bigint": "INTEGER", "real": "REAL", "text": "TEXT", "bool": "INTEGER"}[kind]
	}
	return map[string]string{"int": "INTEGER", "bigint": "BIGINT", "real": "DOUBLE PRECISION", "text": "TEXT", "bool": "BOOLEAN"}[kind]
}

// querier is what the store reads and writes through: the database, or one transaction.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// conn runs the store's queries, written with ?, through q in dialect d.
type conn struct {
	q querier
	d dialect
}

func (c conn) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return c.q.ExecContext(ctx, c.d.rebind(q), c.d.args(args)...)
}

func (c conn) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return c.q.QueryContext(ctx, c.d.rebind(q), c.d.args(args)...)
}

func (c conn) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	return c.q.QueryRowContext(ctx, c.d.rebind(q), c.d.args(args)...)
}

// execScript runs the statements of a migration one by one (separated by ";\n").
func (c conn) execScript(ctx context.Context, script string) error {
	for _, st := range strings.Split(script, ";\n") {
		if st = strings.TrimSpace(st); st == "" {
			continue
		}
		if _, err := c.q.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("%s: %w", firstLine(st), err)
		}
	}
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return cut(s, 80)
}
