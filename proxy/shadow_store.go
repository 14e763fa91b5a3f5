package proxy

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// storeCloseTimeout bounds how long closing writes what a shared store's writer still holds.
const storeCloseTimeout = 5 * time.Second

// openStore opens the shadow store of c (in memory unless shadow.store names a file) the
// first time a route mirrors. A shared store (a PostgreSQL URL) is opened by its writer, in
// the background and again until it answers: the gateway serves meanwhile, and the records
// wait in the writer. Called with sh.mu held.
func (sh *shadowing) openStore(c *config.Config) {
	if sh.store.Load() != nil || sh.storeErr != nil || sh.writer.Load() != nil {
		return
	}
	if shadow.IsPostgresURL(c.Shadow.Store) {
		dsn := c.Shadow.Store
		w := shadow.StartWriter(func(ctx context.Context) (*shadow.Store, error) { return shadow.OpenStore(ctx, dsn) },
			shadow.WriterConfig{MaxBytes: int64(c.Shadow.Buffer), Log: sh.srv.log.With("store", shadow.RedactDSN(dsn)),
				OnOpen: func(st *shadow.Store) {
					sh.store.Store(st)
					sh.srv.log.Info("shadow store opened", "store", st.Path(), "instance", instance(sh.srv.Config()))
				}})
		sh.writer.Store(w)
		return
	}
	ctx, cancel := context.WithTimeout(sh.srv.baseCtx, 10*time.Second)
	defer cancel()
	st, err := shadow.OpenStore(ctx, c.Shadow.Store)
	if err != nil {
		// Mirroring and verdicts go on in memory; only their history is lost.
		sh.storeErr = fmt.Errorf("shadow store %q: %w", c.Shadow.Store, err)
		sh.srv.log.Error("shadow store not opened; pairs and verdicts are not kept", "err", err)
		return
	}
	sh.store.Store(st)
}

// closeStore writes what a shared store's writer holds (for a few seconds at most) and
// closes the store.
func (sh *shadowing) closeStore() {
	if w := sh.writer.Load(); w != nil {
		ctx, cancel := context.WithTimeout(context.Background(), storeCloseTimeout)
		defer cancel()
		if err := w.Close(ctx); err != nil { // it closes the store it opened
			sh.srv.log.Warn("shadow store close", "err", err)
		}
		sh.store.Store(nil)
		return
	}
	if st := sh.store.Swap(nil); st != nil {
		if err := st.Close(); err != nil {
			sh.srv.log.Warn("shadow store close", "err", err)
		}
	}
}

// hostname is the host's name, read once: the default shadow.instance.
var hostname = sync.OnceValue(func() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "sluice"
	}
	return h
})

// instance is this gateway's name in a shared store: shadow.instance, else the host name.
func instance(c *config.Config) string {
	if c.Shadow.Instance != "" {
		return c.Shadow.Instance
	}
	return hostname()
}

// restore refills a new route mirror's comparison from the store (its own candidate's pairs
// only), so a verdict survives a restart. A shared store is not read here (it may be down,
// and sh.mu is held): the verdicts read the fleet's pairs from it (judgeInput). Called with
// sh.mu held.
func (sh *shadowing) restore(mr *mirrorRoute, window int) {
	st := sh.store.Load()
	if st == nil || sh.writer.Load() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(sh.srv.baseCtx, 10*time.Second)
	defer cancel()
	if err := st.Restore(ctx, mr.Name(), mr.Identity(), mr.Accumulator(), window); err != nil {
		sh.srv.log.Warn("shadow pairs not restored", "route", mr.Name(), "err", err)
	}
}

// recordPair keeps one compared pair: written at once to a store of this gateway's own,
// handed to the writer of a shared one (which never makes the comparer wait).
func (sh *shadowing) recordPair(ctx context.Context, j *shadow.Job, rec shadow.PairRecord) {
	if w := sh.writer.Load(); w != nil {
		rec.Instance = instance(sh.srv.Config())
		w.AddPairSession(rec, j.Request.Session) // dropped (counted) when the writer is full
		return
	}
	st := sh.store.Load()
	if st == nil {
		return
	}
	if j.Request.Session != "" {
		rec.Session = st.SessionHash(j.Request.Session)
	}
	// The pair is complete: keep it even when the mirror is being stopped.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := st.AddPair(ctx, rec); err != nil {
		sh.srv.log.Warn("shadow pair not stored", "route", rec.Route, "err", err)
	}
}

// retention is how many pairs per route the store keeps: shadow.retention for a file, and no
// more than the verdict's window in memory (pairs there are only for the verdict and the
// report; a file keeps history).
func retention(c *config.Config) int {
	if c.Shadow.Store == "" || c.Shadow.Store == ":memory:" {
		return min(c.Shadow.Retention, c.Shadow.Window)
	}
	return c.Shadow.Retention
}

// recordVerdict keeps a verdict (with the pairs behind it) and prunes the route's pairs.
func (sh *shadowing) recordVerdict(ctx context.Context, mr *mirrorRoute, v shadow.Verdict, action string, now time.Time, pairs, replicas int64) {
	c := sh.srv.Config()
	rec := shadow.VerdictRecord{Route: mr.Name(), CandidateID: mr.Identity(), Time: now, Verdict: v, Pairs: pairs, Replicas: replicas, Action: action}
	if w := sh.writer.Load(); w != nil {
		rec.Instance = instance(c)
		w.AddVerdict(rec)
		w.Prune(mr.Name(), retention(c))
		return
	}
	st := sh.store.Load()
	if st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := st.AddVerdict(ctx, rec); err != nil {
		sh.srv.log.Warn("shadow verdict not stored", "route", mr.Name(), "err", err)
		return
	}
	if err := st.Prune(ctx, mr.Name(), retention(c)); err != nil {
		sh.srv.log.Warn("shadow pairs not pruned", "route", mr.Name(), "err", err)
	}
}

// storeStatus describes the shadow store for the report (nil when no route mirrors).
func (sh *shadowing) storeStatus() *shadow.StoreStatus {
	c := sh.srv.Config()
	if w := sh.writer.Load(); w != nil {
		ws := w.Stats()
		return &shadow.StoreStatus{Kind: "postgres", Location: shadow.RedactDSN(c.Shadow.Store), Shared: true,
			Instance: instance(c), Writer: &ws}
	}
	if st := sh.store.Load(); st != nil {
		return &shadow.StoreStatus{Kind: st.Kind(), Location: st.Path()}
	}
	sh.mu.Lock()
	err := sh.storeErr
	sh.mu.Unlock()
	if err != nil {
		return &shadow.StoreStatus{Kind: "sqlite", Location: c.Shadow.Store, Error: err.Error()}
	}
	return nil
}
