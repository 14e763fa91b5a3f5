package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// openStore opens the shadow store of c (in memory unless shadow.store names a file) the
// first time a route mirrors. Called with sh.mu held.
func (sh *shadowing) openStore(c *config.Config) {
	if sh.store.Load() != nil || sh.storeErr != nil {
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

// restore refills a new route mirror's comparison from the store (its own candidate's pairs
// only), so a verdict survives a restart. Called with sh.mu held.
func (sh *shadowing) restore(mr *mirrorRoute, window int) {
	st := sh.store.Load()
	if st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(sh.srv.baseCtx, 10*time.Second)
	defer cancel()
	if err := st.Restore(ctx, mr.name, mr.identity, mr.acc, window); err != nil {
		sh.srv.log.Warn("shadow pairs not restored", "route", mr.name, "err", err)
	}
}

// recordPair keeps one compared pair.
func (sh *shadowing) recordPair(ctx context.Context, j *mirrorJob, rec shadow.PairRecord) {
	st := sh.store.Load()
	if st == nil {
		return
	}
	rec.RequestID = j.preq.ID
	if j.preq.Session != "" {
		rec.Session = st.SessionHash(j.preq.Session)
	}
	rec.Endpoint = j.endpoint
	// The pair is complete: keep it even when the mirror is being stopped.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := st.AddPair(ctx, rec); err != nil {
		sh.srv.log.Warn("shadow pair not stored", "route", j.route.name, "err", err)
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

// recordVerdict keeps a verdict and prunes the route's pairs.
func (sh *shadowing) recordVerdict(ctx context.Context, mr *mirrorRoute, v shadow.Verdict, action string, now time.Time) {
	st := sh.store.Load()
	if st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pairs, replicas := mr.acc.Counts()
	rec := shadow.VerdictRecord{Route: mr.name, CandidateID: mr.identity, Time: now, Verdict: v, Pairs: pairs, Replicas: replicas, Action: action}
	if err := st.AddVerdict(ctx, rec); err != nil {
		sh.srv.log.Warn("shadow verdict not stored", "route", mr.name, "err", err)
		return
	}
	if err := st.Prune(ctx, mr.name, retention(sh.srv.Config())); err != nil {
		sh.srv.log.Warn("shadow pairs not pruned", "route", mr.name, "err", err)
	}
}
