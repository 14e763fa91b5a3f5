package shadow

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync"
)

// ProgressionLock is the lock the control planes (sluice xds) sharing a store take to run
// the weight progression: one of them at a time leads (Leader).
const ProgressionLock int64 = 0x736c756963650002 // "sluice" and 2; pgMigrationLock is 1

// Leader is a claim on one of a shared store's locks, so that of the processes sharing a
// PostgreSQL store one at a time does a thing (the leader): a session-level advisory lock
// (pg_try_advisory_lock) held on a connection of its own, taken out of the store's pool while
// it is held. The lock is the session's: it is lost when the connection drops (the
// database, or the network to it, went away; the process died), and another process's Try
// then takes it. A SQLite store is one host's, and its Leader always leads.
//
// A Leader is safe for concurrent use.
type Leader struct {
	st  *Store
	key int64

	mu   sync.Mutex
	conn *sql.Conn // the session holding the lock; nil while it is not held
}

// Leader returns the store's claim on the lock key (nothing is asked of the database until
// Try).
func (s *Store) Leader(key int64) *Leader { return &Leader{st: s, key: key} }

// Try reports whether l holds the lock now. Holding it, it checks that the session holding
// it still answers (a session that does not has lost it, or will: it is closed, and the lock
// tried for again); not holding it, it tries to take it, without waiting. Call it before
// each thing only the leader may do, and do it only when it reports true. An error says why
// the database could not be asked (held is then false).
func (l *Leader) Try(ctx context.Context) (held bool, err error) {
	if l.st.d.tryLock == "" {
		return true, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		perr := l.conn.PingContext(ctx)
		if perr == nil {
			return true, nil
		}
		// The session does not answer: the lock is gone with it, or goes when the database
		// finds it dead. Closed here, so that it is not held by this process either.
		discard(l.conn)
		l.conn = nil
		if ctx.Err() != nil {
			return false, fmt.Errorf("shadow store: leader lock lost: %w", perr)
		}
	}
	c, err := l.st.db.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("shadow store: leader lock: %w", err)
	}
	if l.st.d.keepalive != "" {
		// Best effort: without it a vanished leader's lock is released when the server's
		// own TCP keep-alives give up.
		_, _ = c.ExecContext(ctx, l.st.d.keepalive)
	}
	var ok bool
	if err := c.QueryRowContext(ctx, l.st.d.rebind(l.st.d.tryLock), l.key).Scan(&ok); err != nil {
		discard(c) // its state is not known: it may hold the lock
		return false, fmt.Errorf("shadow store: leader lock: %w", err)
	}
	if !ok {
		_ = c.Close() // back to the pool: the session holds nothing
		return false, nil
	}
	l.conn = c
	return true, nil
}

// Held reports whether l held the lock at its last Try (the database is not asked).
func (l *Leader) Held() bool {
	if l.st.d.tryLock == "" {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn != nil
}

// Release gives the lock up, ending the session that holds it (the lock goes with it,
// whatever its state). A later Try may take it again.
func (l *Leader) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		discard(l.conn)
		l.conn = nil
	}
}

// discard closes c's connection rather than returning it to the pool: a session-level lock
// it may hold ends with it.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
	_ = c.Close()
}
