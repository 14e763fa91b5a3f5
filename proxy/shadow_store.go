package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// openStore opens the shadow store of c (in memory unless shadow.store names a file) the
// first time a route mirrors. Called with sh.mu held.
func (sh *shadowing) openStore(c *config.Config) {
	if sh.store != nil || sh.storeErr != nil {
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
	sh.store = st
}

// restore refills a new route mirror's comparison from the store, so a verdict survives a
// restart. Called with sh.mu held.
func (sh *shadowing) restore(mr *mirrorRoute, window int) {
	if sh.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(sh.srv.baseCtx, 10*time.Second)
	defer cancel()
	if err := sh.store.Restore(ctx, mr.name, mr.acc, window); err != nil {
		sh.srv.log.Warn("shadow pairs not restored", "route", mr.name, "err", err)
	}
}

// recordPair keeps one compared pair.
func (sh *shadowing) recordPair(ctx context.Context, j *mirrorJob, rec shadow.PairRecord) {
	st := sh.storeOf()
	if st == nil {
		return
	}
	rec.RequestID = j.preq.ID
	if j.preq.Session != "" {
		sum := sha256.Sum256([]byte(j.preq.Session))
		rec.Session = hex.EncodeToString(sum[:8])
	}
	rec.Endpoint = j.endpoint
	// The pair is complete: keep it even when the mirror is being stopped.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := st.AddPair(ctx, rec); err != nil {
		sh.srv.log.Warn("shadow pair not stored", "route", j.route.name, "err", err)
	}
}

// recordVerdict keeps a verdict and prunes the route's pairs to shadow.retention.
func (sh *shadowing) recordVerdict(ctx context.Context, mr *mirrorRoute, v shadow.Verdict, action string, now time.Time) {
	st := sh.storeOf()
	if st == nil {
		return
	}
	pairs, replicas := mr.acc.Counts()
	rec := shadow.VerdictRecord{Route: mr.name, Time: now, Verdict: v, Pairs: pairs, Replicas: replicas, Action: action}
	if err := st.AddVerdict(ctx, rec); err != nil {
		sh.srv.log.Warn("shadow verdict not stored", "route", mr.name, "err", err)
		return
	}
	if err := st.Prune(ctx, mr.name, sh.srv.Config().Shadow.Retention); err != nil {
		sh.srv.log.Warn("shadow pairs not pruned", "route", mr.name, "err", err)
	}
}

func (sh *shadowing) storeOf() *shadow.Store {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.store
}
