package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestServerStopsAndRestarts: a started server answers on its URL, refuses once stopped,
// and answers again, with its data, after Restart.
func TestServerStopsAndRestarts(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := s.CreateDB(t, "probe")
	query := func() (int, error) {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return 0, err
		}
		defer c.Close(ctx)
		var n int
		err = c.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n)
		return n, err
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (1), (2)`); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	if n, err := query(); err != nil || n != 2 {
		t.Fatalf("before stop: %d rows, %v", n, err)
	}
	s.Stop(t)
	if _, err := query(); err == nil {
		t.Fatal("a stopped server answered")
	}
	s.Restart(t)
	if n, err := query(); err != nil || n != 2 {
		t.Fatalf("after restart: %d rows, %v", n, err)
	}
}
