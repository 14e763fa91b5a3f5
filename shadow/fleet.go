package shadow

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"
)

// errInvalidRecord marks a record no store takes (writing it again would fail again);
// errNoRoute is one of them.
var (
	errInvalidRecord = errors.New("invalid record")
	errNoRoute       = fmt.Errorf("%w: route is empty", errInvalidRecord)
)

// RateRecord is the request rates one gateway instance measured for a route over its last
// verdict interval: requests begun a second per endpoint on the route's reference cluster
// (the baseline's, else the primary's) and on the candidate's. A store keeps the latest of
// each instance; the fleet's rates are their sums (FleetInput).
type RateRecord struct {
	Route, CandidateID, Instance string
	Time                         time.Time
	ReferenceRate, CandidateRate float64
}

// DefaultRateFreshness is how far behind the newest rate record of a route another
// instance's may be and still count in the fleet's rates (FleetInput with fresh ≤ 0).
const DefaultRateFreshness = 30 * time.Second

// RateRetention is how old, behind the newest of its route, a rate record may grow before
// Prune deletes it (the instance is gone).
const RateRetention = time.Hour

// AddRate keeps r as its instance's latest rates for the route and candidate (replacing the
// one before). Rates must be finite and not negative.
func (s *Store) AddRate(ctx context.Context, r RateRecord) error {
	if r.Route == "" {
		return fmt.Errorf("shadow store: add rate: %w", errNoRoute)
	}
	for _, v := range []float64{r.ReferenceRate, r.CandidateRate} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("shadow store: add rate: %w: rate %v", errInvalidRecord, v)
		}
	}
	ts := r.Time
	if ts.IsZero() {
		ts = time.Now()
	}
	_, err := s.c().exec(ctx, `INSERT INTO rates (route, candidate, instance, ts_ns, reference_rate, candidate_rate)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (route, candidate, instance) DO UPDATE SET ts_ns = excluded.ts_ns,
			reference_rate = excluded.reference_rate, candidate_rate = excluded.candidate_rate`,
		cut(r.Route, MaxNameLen), cut(r.CandidateID, MaxNameLen), cut(r.Instance, MaxNameLen), ts.UnixNano(),
		r.ReferenceRate, r.CandidateRate)
	if err != nil {
		return fmt.Errorf("shadow store: add rate: %w", err)
	}
	return nil
}

// Fleet is the input of a route's verdict rebuilt from a store: in a shared store, the
// union of every gateway instance's pairs.
type Fleet struct {
	// Input is what Evaluate judges: the window of the newest pairs (as Restore rebuilds
	// it) with, when instances stored them, the fleet's request rates.
	Input Input
	// Pairs and Replicas are the rebuilt accumulator's totals (Accumulator.Counts).
	Pairs, Replicas int64
	// Candidate is the candidate judged (the one asked, or the newest pair's).
	Candidate string
	// Sources are the gateway instances of the window's pairs (the newest window replayed),
	// sorted, with how many each ("" names pairs stored before instances were named; past
	// 64 names, the others count together as "(others)").
	Sources []Source
	// RateInstances is how many instances' rates were summed into Input.Load.
	RateInstances int
}

// Source is one gateway instance's share of a Fleet.
type Source struct {
	Instance string `json:"instance"`
	Pairs    int    `json:"pairs"`
}

// FleetInput rebuilds the input of route's verdict from the store, the same whichever
// gateway asks: the newest pairs of route and candidate ("" : the newest pair's) replayed
// through a new Accumulator of window as Restore does (every gateway's, in a shared store,
// ordered by time and then by the order the database stored them), and the request rates
// per endpoint summed over the instances whose latest rates are at most fresh behind the
// newest (DefaultRateFreshness when fresh ≤ 0), in the order of their names. In
// PostgreSQL it reads one snapshot (a read-only repeatable-read transaction).
func (s *Store) FleetInput(ctx context.Context, route, candidate string, window int, fresh time.Duration) (Fleet, error) {
	var f Fleet
	c := s.c()
	if s.d.dollar {
		tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		if err != nil {
			return f, fmt.Errorf("shadow store: fleet input %q: %w", route, err)
		}
		defer tx.Rollback() //nolint:errcheck // read-only: nothing to keep
		c = conn{q: tx, d: s.d}
	}
	acc := NewAccumulator(window)
	n, err := s.restore(ctx, c, route, candidate, acc, window)
	if err != nil {
		return f, err
	}
	f.Input = acc.Input()
	f.Pairs, f.Replicas = acc.Counts()
	f.Candidate = n.candidate
	for name, k := range n.sources.counts() {
		f.Sources = append(f.Sources, Source{Instance: name, Pairs: k})
	}
	sort.Slice(f.Sources, func(i, j int) bool { return f.Sources[i].Instance < f.Sources[j].Instance })
	if fresh <= 0 {
		fresh = DefaultRateFreshness
	}
	rows, err := c.query(ctx, `SELECT reference_rate, candidate_rate FROM rates WHERE route = ? AND candidate = ?
		AND ts_ns >= (SELECT MAX(ts_ns) FROM rates WHERE route = ? AND candidate = ?) - ? ORDER BY instance`,
		route, n.candidate, route, n.candidate, int64(fresh))
	if err != nil {
		return f, fmt.Errorf("shadow store: fleet rates %q: %w", route, err)
	}
	defer rows.Close()
	var ref, cand float64
	for rows.Next() {
		var r, c float64
		if err := rows.Scan(&r, &c); err != nil {
			return f, fmt.Errorf("shadow store: fleet rates %q: %w", route, err)
		}
		ref, cand = ref+r, cand+c
		f.RateInstances++
	}
	if err := rows.Err(); err != nil {
		return f, fmt.Errorf("shadow store: fleet rates %q: %w", route, err)
	}
	f.Input.Load.ReferenceRate, f.Input.Load.CandidateRate = ref, cand
	return f, nil
}
