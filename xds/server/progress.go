package server

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// The control plane's weight progression: for every route with a mirror.progression it judges
// the fleet's verdict from the shared shadow store each shadow.interval (shadow.Store.FleetInput
// and shadow.Evaluate with the served config's shadow.verdict: the numbers every replica
// computes) and steps the candidate's split weight as a file-configured gateway does on its
// own: promote adds step, at most once per progression interval, up to max; rollback sets 0.
// The new weights are an overlay on the file's, pushed to every replica in a new snapshot.
//
// The overlay lives in memory; the steps are in the store too (verdicts of Instance whose
// action is the change). A control plane that starts recovers each route's weight from them
// before its first judgement (restoreWeights), so that a restart undoes neither a rollback
// nor a promotion.

// Instance names the control plane in the shadow store: the gateway instance of the verdicts
// it records (with the weight it set as their action). A host name cannot contain a space, so
// it is never a replica's.
const Instance = "sluice xds"

const (
	// fleetReadTimeout bounds reading one route's fleet window from the store.
	fleetReadTimeout = 5 * time.Second
	// ownStepsWait bounds writing the control plane's own held steps before it reads the
	// store's back.
	ownStepsWait = 2 * time.Second
	// storeWait is Options.StoreWait's default.
	storeWait = 5 * time.Second
	// writerCloseWait bounds writing the verdicts held when Serve returns.
	writerCloseWait = 5 * time.Second
	// maxSteps is how many weight changes per route the status keeps.
	maxSteps = 32
	// restoreSteps is how many of a route's newest weight steps are read to recover its
	// weight at start: a rollout traced back further is not recovered.
	restoreSteps = 1000
)

// Step is one weight change of a route's candidate split made by the control plane.
type Step struct {
	Time     time.Time       `json:"time"`
	Decision shadow.Decision `json:"decision"`
	Split    string          `json:"split"`
	From     int             `json:"from"`
	To       int             `json:"to"`
	// Version is the snapshot that carried it to the replicas ("" for a step recovered from
	// the store, made before the control plane last started).
	Version string `json:"version"`
	// Action is what was recorded in the shadow store as the verdict's action.
	Action string `json:"action"`
}

// Judged is the fleet verdict the control plane computed last for a route.
type Judged struct {
	Time     time.Time       `json:"time"`
	Decision shadow.Decision `json:"decision"`
	Reason   string          `json:"reason"`
	// Pairs and Replicas are the totals of the window judged, Sources the gateway instances
	// whose pairs it holds.
	Pairs    int64           `json:"pairs"`
	Replicas int64           `json:"replicas"`
	Sources  []shadow.Source `json:"sources"`
	// Seconds is how long reading the window and judging it took.
	Seconds float64 `json:"seconds"`
}

// RouteProgress is the control plane's state of one route with a progression.
type RouteProgress struct {
	Route string `json:"route"`
	// Split is the candidate's split, Candidate what the verdict compares (as the replicas
	// name it in the store: the mirror's cluster, "/model" when rewritten, " vs baseline").
	Split     string          `json:"split"`
	Candidate string          `json:"candidate"`
	Step      int             `json:"step"`
	Max       int             `json:"max"`
	Interval  config.Duration `json:"interval"`
	// FileWeight is the split's weight in the file, Weight the one the replicas are sent;
	// Overridden says Weight is the control plane's.
	FileWeight int  `json:"file_weight"`
	Weight     int  `json:"weight"`
	Overridden bool `json:"overridden"`
	// Recovered says Weight (and Steps, SteppedAt) were recovered from the steps recorded in
	// the store when the control plane started, and the file has not reset them since.
	Recovered bool `json:"recovered,omitempty"`
	// SteppedAt is the last weight change (a promote steps again at most one interval later).
	SteppedAt *time.Time `json:"stepped_at,omitempty"`
	Verdict   *Judged    `json:"verdict,omitempty"`
	// Steps are the latest weight changes, oldest first (at most 32).
	Steps []Step `json:"steps"`
	// Error is why the last judgement could not be made or acted on ("" when it was).
	Error string `json:"error,omitempty"`
}

// progressState is what the server keeps of a route with a progression between judgements.
type progressState struct {
	stepped   time.Time
	verdict   *Judged
	steps     []Step
	err       string
	recovered bool
}

// identityOf names what a route's mirror compares, exactly as the replicas name it in the
// store: the mirror's shadow.Settings.Identity (the candidate cluster, "/model" when the
// mirror rewrites the model, and " vs baseline" with one).
func identityOf(m *config.Mirror) string {
	return (&shadow.Settings{Cluster: m.Cluster, Model: m.Model, Baseline: m.Baseline}).Identity()
}

// progressed reports the route's progression (nil without one).
func progressed(r config.Route) *config.Progression {
	if r.Mirror == nil {
		return nil
	}
	return r.Mirror.Progression
}

// splitIndex is the index of the route's split named name (the split's name, else its
// cluster, as route.Router.SetWeights names them), or -1.
func splitIndex(splits []route.Split, name string) int {
	return slices.IndexFunc(splits, func(sp route.Split) bool {
		return sp.Name == name || sp.Name == "" && sp.Cluster == name
	})
}

// nextWeight is the candidate split's weight after verdict d, from cur (Flagger style, as a
// file-configured gateway steps it): rollback sets 0; promote adds p.Step, up to p.Max, when
// the last step is at least p.Interval ago; anything else keeps cur.
func nextWeight(d shadow.Decision, cur int, p config.Progression, stepped, now time.Time) int {
	switch d {
	case shadow.Rollback:
		return 0
	case shadow.Promote:
		if cur < p.Max && (stepped.IsZero() || now.Sub(stepped) >= p.Interval.D()) {
			return min(p.Max, cur+p.Step)
		}
	}
	return cur
}

// progressKey is what of a route, when the file changes it, discards the control plane's
// weight for it: its splits (names, clusters, weights), its progression's split and what its
// mirror compares. Other changes (the progression's step, interval or max included) keep it.
func progressKey(r config.Route) string {
	p := progressed(r)
	if p == nil {
		return ""
	}
	k := identityOf(r.Mirror) + "\x00" + p.Split
	for _, sp := range r.Splits {
		k += "\x00" + sp.Name + "\x01" + sp.Cluster + "\x01" + strconv.Itoa(sp.Weight)
	}
	return k
}

// keptOverlay is the part of overlay (route → its candidate split's weight) that survives the
// file changing from old to next: a route's weight is dropped when next changes its splits,
// its progression's split or its candidate (progressKey), or has no progression for it any
// more. The dropped routes are returned, sorted.
func keptOverlay(old, next *config.Config, overlay map[string]int) (map[string]int, []string) {
	kept := map[string]int{}
	var dropped []string
	for name, w := range overlay {
		or, nr := findRoute(old, name), findRoute(next, name)
		if or == nil || nr == nil || progressKey(*nr) == "" || progressKey(*or) != progressKey(*nr) {
			dropped = append(dropped, name)
			continue
		}
		kept[name] = w
	}
	slices.Sort(dropped)
	return kept, dropped
}

func findRoute(c *config.Config, name string) *config.Route {
	if c == nil {
		return nil
	}
	for i := range c.Routes {
		if c.Routes[i].Name == name {
			return &c.Routes[i]
		}
	}
	return nil
}

// withWeights is c with the overlay's weights on its routes' progression splits: a copy (the
// file's config is never changed), sharing everything but the routes and their splits.
func withWeights(c *config.Config, overlay map[string]int) *config.Config {
	if len(overlay) == 0 {
		return c
	}
	out := *c
	out.Routes = slices.Clone(c.Routes)
	for i := range out.Routes {
		r := &out.Routes[i]
		w, ok := overlay[r.Name]
		p := progressed(*r)
		if !ok || p == nil {
			continue
		}
		if j := splitIndex(r.Splits, p.Split); j >= 0 {
			r.Splits = slices.Clone(r.Splits)
			r.Splits[j].Weight = w
		}
	}
	return &out
}

// weightIn is the weight of route name's progression split in c (false without one).
func weightIn(c *config.Config, name string) (int, bool) {
	r := findRoute(c, name)
	if r == nil {
		return 0, false
	}
	return weightOf(*r)
}

// weightOf is the weight of the route's progression split (false when it has none).
func weightOf(r config.Route) (int, bool) {
	p := progressed(r)
	if p == nil {
		return 0, false
	}
	j := splitIndex(r.Splits, p.Split)
	if j < 0 {
		return 0, false
	}
	return r.Splits[j].Weight, true
}

// snapshotVersion is the version of the snapshot served: the file's, and with weights of the
// control plane's "+p" and the count of weight changes so far (unique within the process).
func snapshotVersion(fileVersion string, overlay map[string]int, pushes int) string {
	if len(overlay) == 0 {
		return fileVersion
	}
	return fileVersion + "+p" + strconv.Itoa(pushes)
}

// judged is one route's fleet verdict, read and computed outside the server's lock.
type judged struct {
	route     string
	candidate string
	verdict   shadow.Verdict
	fleet     shadow.Fleet
	took      time.Duration
	err       error
	// readFailed: err is the store's, reading the route's window (counted as a failed read).
	readFailed bool
}

// judgeAll judges every route with a progression over the fleet's pairs and steps its weight;
// it returns how many weights changed. Reading the store happens without the server's lock;
// a file change meanwhile discards the round (the next one judges the new file).
//
// Only the leader judges (leading: of the control planes sharing a PostgreSQL store, the one
// holding its progression lock; with a SQLite store, the one there is). A follower serves
// the weights the leader's steps recorded in the store instead (followLeader), and changes
// nothing in the store.
func (s *Server) judgeAll(ctx context.Context, now time.Time) int {
	w := s.writer.Load()
	if w == nil || ctx.Err() != nil {
		return 0 // stopping: neither judge nor follow (a failed read would be logged)
	}
	st := w.Store()
	if st != nil {
		if !s.leading(ctx, st) {
			return s.followLeader(ctx, st)
		}
		if !s.restoreWeights(ctx, st) {
			return 0 // judged from the file's weights, a step could undo what the store says
		}
	}
	s.mu.Lock()
	file, gen := s.file, s.gen
	s.mu.Unlock()
	var out []judged
	for _, r := range file.Routes {
		if progressed(r) == nil {
			continue
		}
		j := judged{route: r.Name, candidate: identityOf(r.Mirror)}
		if st == nil {
			j.err = fmt.Errorf("shadow store %s not open yet", shadow.RedactDSN(s.storeURL))
			if e := w.Stats().LastError; e != "" {
				j.err = fmt.Errorf("%w: %s", j.err, e)
			}
			out = append(out, j)
			continue
		}
		t0 := time.Now()
		rctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
		j.fleet, j.err = st.FleetInput(rctx, r.Name, j.candidate, file.Shadow.Window, file.Shadow.RateFreshness())
		cancel()
		j.readFailed = j.err != nil
		if j.err == nil {
			j.verdict, j.err = shadow.Evaluate(file.Shadow.Verdict, j.fleet.Input)
		}
		j.took = time.Since(t0)
		out = append(out, j)
	}
	changed := 0
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen {
		return 0
	}
	for _, j := range out {
		if s.act(ctx, j, now) {
			changed++
		}
	}
	return changed
}

// act records route j's verdict and applies its weight change, pushing a new snapshot (called
// with s.mu held). It reports whether the weight changed.
func (s *Server) act(ctx context.Context, j judged, now time.Time) bool {
	ps := s.state(j.route)
	if j.readFailed {
		s.readFailures[j.route]++
	}
	if j.err != nil {
		ps.err = j.err.Error()
		s.log.Warn("progression: fleet verdict not judged", "route", j.route, "err", j.err)
		return false
	}
	ps.err = ""
	ps.verdict = &Judged{Time: now, Decision: j.verdict.Decision, Reason: j.verdict.Reason, Pairs: j.fleet.Pairs,
		Replicas: j.fleet.Replicas, Sources: j.fleet.Sources, Seconds: j.took.Seconds()}
	s.log.Debug("progression: fleet verdict", "route", j.route, "candidate", j.candidate, "decision", j.verdict.Decision,
		"pairs", j.fleet.Pairs, "took", j.took)
	r := findRoute(s.file, j.route)
	if r == nil {
		return false
	}
	p := progressed(*r)
	cur, ok := weightIn(s.served, j.route)
	if p == nil || !ok {
		return false
	}
	next := nextWeight(j.verdict.Decision, cur, *p, ps.stepped, now)
	if next == cur {
		return false
	}
	overlay := maps.Clone(s.overlay)
	if fw, _ := weightOf(*r); fw == next {
		delete(overlay, j.route) // back at the file's weight
	} else {
		overlay[j.route] = next
	}
	action := fmt.Sprintf("weight %s %d→%d", p.Split, cur, next)
	eff := withWeights(s.file, overlay)
	if err := eff.Validate(); err != nil {
		ps.err = fmt.Sprintf("%s refused: %v", action, err)
		s.log.Error("progression: weight refused", "route", j.route, "split", p.Split, "from", cur, "to", next, "err", err)
		return false
	}
	version := snapshotVersion(s.fileVersion, overlay, s.pushes+1)
	if err := s.publish(ctx, eff, version, pushProgression); err != nil {
		ps.err = fmt.Sprintf("%s not pushed: %v", action, err)
		s.log.Error("progression: snapshot not pushed", "route", j.route, "err", err)
		return false
	}
	s.overlay, s.pushes = overlay, s.pushes+1
	s.stepCounts[stepKey{j.route, j.verdict.Decision}]++
	ps.stepped = now
	ps.steps = append(ps.steps, Step{Time: now, Decision: j.verdict.Decision, Split: p.Split, From: cur, To: next, Version: version, Action: action})
	if len(ps.steps) > maxSteps {
		ps.steps = slices.Delete(ps.steps, 0, len(ps.steps)-maxSteps)
	}
	s.log.Info("progression: weight pushed", "route", j.route, "candidate", j.candidate, "decision", j.verdict.Decision,
		"reason", j.verdict.Reason, "split", p.Split, "from", cur, "to", next, "version", version,
		"pairs", j.fleet.Pairs, "nodes", len(s.nodesLocked()))
	s.writer.Load().AddVerdict(shadow.VerdictRecord{Route: j.route, CandidateID: j.candidate, Time: now, Verdict: j.verdict,
		Pairs: j.fleet.Pairs, Replicas: j.fleet.Replicas, Action: action, Instance: Instance})
	return true
}

// progressStatus is every progressed route's state (called with s.mu held).
func (s *Server) progressStatus() []RouteProgress {
	out := []RouteProgress{}
	for _, r := range s.file.Routes {
		p := progressed(r)
		if p == nil {
			continue
		}
		fw, _ := weightOf(r)
		sw, _ := weightIn(s.served, r.Name)
		_, over := s.overlay[r.Name]
		rp := RouteProgress{Route: r.Name, Split: p.Split, Candidate: identityOf(r.Mirror), Step: p.Step, Max: p.Max,
			Interval: p.Interval, FileWeight: fw, Weight: sw, Overridden: over, Steps: []Step{}}
		if ps := s.prog[r.Name]; ps != nil {
			rp.Recovered = ps.recovered
			if !ps.stepped.IsZero() {
				t := ps.stepped
				rp.SteppedAt = &t
			}
			if ps.verdict != nil {
				v := *ps.verdict
				v.Sources = slices.Clone(v.Sources)
				rp.Verdict = &v
			}
			rp.Steps = append(rp.Steps, ps.steps...)
			rp.Error = ps.err
		}
		out = append(out, rp)
	}
	return out
}

// parseStep reads the action of a weight step, "weight SPLIT FROM→TO" (as act records it).
func parseStep(action string) (split string, from, to int, ok bool) {
	rest, ok := strings.CutPrefix(action, "weight ")
	if !ok {
		return "", 0, 0, false
	}
	sp := strings.LastIndexByte(rest, ' ')
	if sp <= 0 {
		return "", 0, 0, false
	}
	f, t, ok := strings.Cut(rest[sp+1:], "→")
	if !ok {
		return "", 0, 0, false
	}
	from, err1 := strconv.Atoi(f)
	to, err2 := strconv.Atoi(t)
	if err1 != nil || err2 != nil || from < 0 || to < 0 {
		return "", 0, 0, false
	}
	return rest[:sp], from, to, true
}

// recovery is what the store says of a route's rollout when the control plane starts.
type recovery struct {
	weight  int
	stepped time.Time
	steps   []Step // oldest first, at most maxSteps
	// why says, when the rollout was not recovered though steps were found, why not.
	why string
}

// recoverRoute traces route r's current rollout back through the weight steps recorded in the
// store (recs, newest first, as Store.Steps returns them): the steps of the control plane
// (Instance) for the route's candidate (identityOf) on its progression split, from the newest
// back while each step started at the weight the one before it set. The rollout is the
// file's when its first step started at the file's weight: its weight is the newest step's.
// When it started elsewhere the file reset the weights since (a new rollout), and nothing
// is recovered; nor when the trace reaches the oldest step read of a full page (its start
// unknown). ok is false when there is no step to recover.
func recoverRoute(r config.Route, recs []shadow.VerdictRecord, full bool) (rec recovery, ok bool) {
	p := progressed(r)
	fw, has := weightOf(r)
	if p == nil || !has {
		return recovery{}, false
	}
	candidate := identityOf(r.Mirror)
	var chain []Step // newest first
	truncated := full
	for _, v := range recs {
		if v.Instance != Instance || v.CandidateID != candidate {
			continue
		}
		split, from, to, ok := parseStep(v.Action)
		if !ok || split != p.Split {
			continue
		}
		if len(chain) > 0 && to != chain[len(chain)-1].From {
			truncated = false // the trace ends before the page does
			break
		}
		chain = append(chain, Step{Time: v.Time, Decision: v.Verdict.Decision, Split: split, From: from, To: to, Action: v.Action})
	}
	if len(chain) == 0 {
		return recovery{}, false
	}
	origin := chain[len(chain)-1].From
	switch {
	case truncated:
		return recovery{why: fmt.Sprintf("its steps go back further than the %d read", len(recs))}, true
	case origin != fw:
		return recovery{why: fmt.Sprintf("its last rollout started at weight %d, the file's is %d (reset since)", origin, fw)}, true
	}
	slices.Reverse(chain)
	if len(chain) > maxSteps {
		chain = chain[len(chain)-maxSteps:]
	}
	head := chain[len(chain)-1]
	return recovery{weight: head.To, stepped: head.Time, steps: chain}, true
}

// restoreWeights recovers, once, each progressed route's weight from the steps recorded in
// the store (storedWeights) and serves them: the overlay the control plane had when it last
// stopped, or the one the leader had when this control plane takes the lead over. It
// reports whether that is done; until it is, judgeAll does not judge (a step from the file's
// weight could undo a rollback or a promotion).
func (s *Server) restoreWeights(ctx context.Context, st *shadow.Store) bool {
	s.mu.Lock()
	done := s.restored
	s.mu.Unlock()
	if done {
		return true
	}
	ok, _ := s.storedWeights(ctx, st, false)
	return ok
}

// followLeader serves, as a follower, the weights the leader's steps recorded in the store
// (storedWeights, every interval): the replicas connected to either control plane get the
// same weights, at most an interval (and the leader's write) apart. It returns how many
// weights changed.
func (s *Server) followLeader(ctx context.Context, st *shadow.Store) int {
	_, changed := s.storedWeights(ctx, st, true)
	return changed
}

// storedWeights sets each progressed route's weight to the one the steps recorded in the
// store set (recoverRoute): the newest step's weight when the route's rollout is traced back
// to the file's weight, else the file's; and pushes a snapshot when a weight changes.
// follow says who asks: a follower, every interval (it logs the weights that change), or a
// control plane about to judge (it logs what it recovered, and reads no more once done:
// Server.restored). It reports whether the store could be read (when not, it says why in
// the routes' status and changes nothing), and how many weights changed. Reading the store
// happens without the server's lock; a file change meanwhile makes the next round try
// again.
func (s *Server) storedWeights(ctx context.Context, st *shadow.Store, follow bool) (read bool, changed int) {
	s.mu.Lock()
	file, gen := s.file, s.gen
	s.mu.Unlock()
	found := map[string]recovery{}
	var readErr error
	failed := ""
	if w := s.writer.Load(); w != nil {
		// Steps this control plane made and still holds (the store was down) must reach the
		// store before it reads them back: else an older chain would undo its newest step
		// (a rollback it has just pushed).
		fctx, cancel := context.WithTimeout(ctx, ownStepsWait)
		err := w.Flush(fctx)
		cancel()
		if err != nil {
			readErr = fmt.Errorf("this control plane's own steps are not written yet: %w", err)
			for _, r := range file.Routes {
				if progressed(r) != nil {
					failed = r.Name
					break
				}
			}
		}
	}
	for _, r := range file.Routes {
		if readErr != nil {
			break
		}
		if progressed(r) == nil {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
		recs, err := st.Steps(rctx, r.Name, restoreSteps)
		cancel()
		if err != nil {
			readErr, failed = err, r.Name
			break
		}
		if rec, ok := recoverRoute(r, recs, len(recs) >= restoreSteps); ok {
			found[r.Name] = rec
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen {
		return false, 0
	}
	if readErr != nil {
		s.readFailures[failed]++
		what := "weight not recovered from the store yet"
		if follow {
			what = "the leader's weight not read from the store"
		}
		for _, r := range file.Routes {
			if progressed(r) != nil {
				s.state(r.Name).err = fmt.Sprintf("%s: %v", what, readErr)
			}
		}
		if follow {
			s.log.Warn("progression: the leader's weights could not be read from the store; serving the weights as they are",
				"route", failed, "err", readErr)
		} else {
			s.log.Warn("progression: the weights could not be recovered from the store; not judging until they are",
				"route", failed, "err", readErr)
		}
		return false, 0
	}
	overlay := maps.Clone(s.overlay)
	for _, r := range file.Routes {
		if progressed(r) == nil {
			continue
		}
		rec, ok := found[r.Name]
		if ok && rec.why != "" && !follow {
			s.log.Info("progression: weight not recovered from the store", "route", r.Name, "why", rec.why)
		}
		fw, _ := weightOf(r)
		if ok && rec.why == "" && rec.weight != fw {
			overlay[r.Name] = rec.weight
		} else {
			delete(overlay, r.Name) // the file's
		}
	}
	before := s.served
	if !maps.Equal(overlay, s.overlay) {
		eff := withWeights(file, overlay)
		err := eff.Validate()
		version := snapshotVersion(s.fileVersion, overlay, s.pushes+1)
		if err == nil {
			err = s.publish(ctx, eff, version, pushStore)
		}
		if err != nil {
			// Not servable with the file as it is now (it changed elsewhere since: say, the
			// route's other splits to 0): the weights served stay (at start the file's, the
			// rollouts starting afresh).
			s.log.Error("progression: the weights recovered from the store refused; serving the weights as they are", "err", err)
			if !follow {
				s.restored = true
			}
			return true, 0
		}
		s.overlay, s.pushes = overlay, s.pushes+1
	}
	for _, r := range file.Routes {
		if progressed(r) == nil {
			continue
		}
		name := r.Name
		ps := s.state(name)
		from, _ := weightIn(before, name)
		to, _ := weightIn(s.served, name)
		if from != to {
			changed++
		}
		rec, ok := found[name]
		if !ok || rec.why != "" {
			if ps.recovered || follow {
				ps.stepped, ps.steps, ps.recovered = time.Time{}, nil, false
			}
			ps.err = ""
			if follow && from != to {
				s.log.Info("progression: the leader's weight served (the file's: the store has no step of its rollout)",
					"route", name, "from", from, "to", to, "version", s.version)
			}
			continue
		}
		ps.stepped, ps.steps, ps.recovered, ps.err = rec.stepped, rec.steps, true, ""
		head := rec.steps[len(rec.steps)-1]
		switch {
		case !follow:
			s.log.Info("progression: weight recovered from the store", "route", name, "split", head.Split,
				"weight", rec.weight, "steps", len(rec.steps), "stepped_at", rec.stepped, "version", s.version)
		case from != to:
			s.log.Info("progression: the leader's weight served", "route", name, "split", head.Split, "from", from, "to", to,
				"action", head.Action, "stepped_at", rec.stepped, "version", s.version)
		}
	}
	if !follow {
		s.restored = true
	}
	return true, changed
}

// leading reports whether this control plane leads the progression: it holds the store's
// progression lock (shadow.Leader, tried again each round; a SQLite store's one control
// plane always leads). A change of role is logged and shown in the status; a control plane
// that takes the lead over reads the weights from the store again before it judges, and one
// that loses it forgets its verdicts (the leader's are in the store).
func (s *Server) leading(ctx context.Context, st *shadow.Store) bool {
	s.mu.Lock()
	if s.lead == nil {
		s.lead = st.Leader(shadow.ProgressionLock)
	}
	l := s.lead
	s.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
	ok, err := l.Try(lctx)
	cancel()
	if ctx.Err() != nil {
		return false // stopping: no change of role to tell
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	was, prevErr := s.role, s.leadErr
	s.leadErr = ""
	if err != nil {
		s.leadErr = err.Error()
	}
	switch {
	case ok && was != RoleLeader:
		s.role, s.leaderSince = RoleLeader, time.Now()
		if was == RoleFollower {
			s.restored = false // the leader's last steps are read before judging
			s.log.Info("progression: leading: this control plane judges and steps the weights now (the previous leader stopped or lost the store)",
				"store", shadow.RedactDSN(s.storeURL))
		} else if st.Shared() {
			s.log.Info("progression: leading: this control plane judges and steps the weights", "store", shadow.RedactDSN(s.storeURL))
		}
	case !ok && was != RoleFollower:
		s.role, s.leaderSince = RoleFollower, time.Time{}
		switch {
		case was == RoleLeader:
			for _, ps := range s.prog {
				ps.verdict = nil
			}
			s.log.Warn("progression: not the leader any more: following the weights the leader records in the store", "err", err)
		case err != nil:
			s.log.Warn("progression: not leading: the store's progression lock could not be tried; following the weights recorded in the store", "err", err)
		default:
			s.log.Info("progression: following: another control plane leads; serving the weights it records in the store")
		}
	case err != nil && s.leadErr != prevErr:
		s.log.Warn("progression: the store's progression lock could not be tried", "role", s.role, "err", err)
	}
	return ok
}

// releaseLead gives the progression lock up (Serve, stopping), after the steps held were
// written: the control plane that leads next reads them. A SQLite store has no lock to
// give up (its one control plane leads; the writer's Close writes what it holds).
func (s *Server) releaseLead(ctx context.Context, w *shadow.Writer) {
	s.mu.Lock()
	l := s.lead
	s.mu.Unlock()
	if st := w.Store(); l == nil || st == nil || !st.Shared() || !l.Held() {
		return
	}
	if err := w.Flush(ctx); err != nil {
		s.log.Warn("progression: steps not written before giving the lead up", "err", err)
	}
	l.Release()
	s.log.Info("progression: the lead given up")
}

// state is route name's progression state, made when missing (called with s.mu held).
func (s *Server) state(name string) *progressState {
	ps := s.prog[name]
	if ps == nil {
		ps = &progressState{}
		s.prog[name] = ps
	}
	return ps
}
