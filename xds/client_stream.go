package xds

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicegw/sluice/proxy/config"
)

// adsStream is one flavour of the ADS protocol (delta or state-of-the-world) on an open
// stream. recv runs on the stream's receiving goroutine; everything else on the session's.
type adsStream interface {
	recv() (*update, error)
	// start sends the first request of every type, resuming from the accepted resources.
	start(acc *store, eds []string) error
	ack(s *session, u *update) error
	nack(s *session, u *update, problems []string) error
	// subscribeEDS changes the endpoint subscription from s.eds to want.
	subscribeEDS(s *session, want []string) error
}

// session is one stream's life: it receives responses, applies or rejects them, and answers.
type session struct {
	c       *Client
	st      adsStream
	eds     []string // endpoint names subscribed on this stream
	asked   bool     // an endpoint request was sent on this stream
	nonces  map[string]string
	rejects map[string]*rejection   // by type: the content rejected last and how often in a row
	pending map[string]*pendingNack // by type: NACKs waiting out their back-off
	nackT   *time.Timer
	warmT   *time.Timer
	warming bool
}

type rejection struct {
	hash string
	n    int
}

type pendingNack struct {
	at       time.Time
	u        *update
	problems []string
}

type received struct {
	u   *update
	err error
}

// session dials, opens the stream and serves it until it fails or ctx is done. healthy
// reports whether the stream got at least one response (the reconnect back-off starts over).
func (c *Client) session(ctx context.Context) (healthy bool, err error) {
	c.setState(StateConnecting)
	defer c.setState(StateDisconnected)
	conn, err := c.dial()
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel() // ends Recv
		wg.Wait()
	}()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	var st adsStream
	if c.opts.Bootstrap.Delta {
		s, err := ads.DeltaAggregatedResources(sctx)
		if err != nil {
			return false, fmt.Errorf("open delta ADS stream: %w", err)
		}
		st = &deltaStream{s: s, c: c}
	} else {
		s, err := ads.StreamAggregatedResources(sctx)
		if err != nil {
			return false, fmt.Errorf("open ADS stream: %w", err)
		}
		st = &sotwStream{s: s, c: c}
	}
	ss := &session{
		c: c, st: st, nonces: map[string]string{}, rejects: map[string]*rejection{},
		pending: map[string]*pendingNack{}, nackT: time.NewTimer(time.Hour), warmT: time.NewTimer(time.Hour),
	}
	ss.nackT.Stop()
	ss.warmT.Stop()
	defer ss.nackT.Stop()
	defer ss.warmT.Stop()

	c.mu.Lock()
	acc := c.acc
	c.mu.Unlock()
	ss.eds = acc.edsNames()
	ss.asked = len(ss.eds) > 0
	if err := st.start(acc, ss.eds); err != nil {
		return false, fmt.Errorf("send initial requests: %w", err)
	}
	c.setState(StateConnected)
	c.log.Info("xds stream open", "delta", c.opts.Bootstrap.Delta)

	recvC := make(chan received)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			u, err := st.recv()
			select {
			case recvC <- received{u, err}:
			case <-sctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	for {
		select {
		case <-sctx.Done():
			return healthy, sctx.Err()
		case r := <-recvC:
			if r.err != nil {
				return healthy, r.err
			}
			healthy = true
			if err := ss.handle(r.u); err != nil {
				return healthy, err
			}
		case <-ss.nackT.C:
			if err := ss.flushNacks(time.Now()); err != nil {
				return healthy, err
			}
		case <-ss.warmT.C:
			ss.warmTimeout()
		}
	}
}

// handle accepts or rejects one response.
func (s *session) handle(u *update) error {
	c := s.c
	if !slices.Contains(clientTypes, u.typeURL) {
		// Not subscribed: ignored without an answer (a state-of-the-world ACK naming no
		// resources would subscribe to every resource of the type).
		c.log.Debug("xds response of a type not subscribed; ignored", "type", u.typeURL)
		return nil
	}
	s.nonces[u.typeURL] = u.nonce
	delete(s.pending, u.typeURL) // a newer response supersedes a NACK still waiting
	c.mu.Lock()
	acc := c.acc
	c.mu.Unlock()

	problems := u.problems
	var (
		cand    *store
		cfg     *config.Config
		applied bool
		waiting []string
	)
	if len(problems) == 0 {
		cand = acc.with(u)
		var err error
		if cfg, err = c.translate(cand); err != nil {
			problems = problemsOf(err)
		}
	}
	if len(problems) == 0 {
		waiting = s.waitingFor(cand, cfg)
		if len(waiting) == 0 {
			if err := c.opts.Apply(cfg); err != nil {
				problems = problemsOf(err)
			} else {
				applied = true
			}
		} else if c.opts.Check != nil {
			// Not applied yet, but ACKed now: it must pass everything Apply would check.
			if err := c.opts.Check(cfg); err != nil {
				problems = problemsOf(err)
			}
		}
	}
	if len(problems) > 0 {
		return s.reject(u, problems)
	}

	now := time.Now()
	c.mu.Lock()
	c.acc = cand
	c.waiting = waiting
	c.acks[u.typeURL]++
	if applied {
		c.served, c.configVersion, c.lastUpdate, c.fromPersisted = cand, cfg.Version, now, false
	}
	c.mu.Unlock()
	delete(s.rejects, u.typeURL)
	log := c.log.With("type", shortType(u.typeURL), "version", u.version, "resources", len(u.upserts), "removed", len(u.removed))
	if applied {
		s.stopWarm()
		log.Info("xds config applied", "config_version", cfg.Version)
		s.persist(cand, cfg.Version)
	} else {
		log.Info("xds update accepted; the config waits for more", "waiting", waiting)
		s.startWarm()
	}
	if err := s.st.ack(s, u); err != nil {
		return fmt.Errorf("send ACK: %w", err)
	}
	return s.syncEDS(cand)
}

// waitingFor is what the candidate still lacks and has not given up waiting for: see
// store.missing, and the clusters its routes name that were not received (control planes
// send CDS and RDS in any order; applying at once would answer 503 in between).
func (s *session) waitingFor(cand *store, cfg *config.Config) []string {
	c := s.c
	missing := cand.missing(c.opts.Bootstrap.RouteConfig)
	for _, cl := range cfg.Clusters {
		if _, ok := cand.types[typeCluster][cl.Name]; !ok && cl.Pending {
			missing = append(missing, "cds:"+cl.Name)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.served == nil && !cand.seen[typePolicy] {
		// The first config waits for the global policy too (tenants, time-outs): serving
		// without it would, for instance, refuse every key of a route that requires one.
		missing = append(missing, "ecds:"+PolicyName)
	}
	for k := range c.warmExpired {
		if !slices.Contains(missing, k) {
			delete(c.warmExpired, k) // arrived: wait for it again should it go missing
		}
	}
	var out []string
	for _, m := range missing {
		if !c.warmExpired[m] {
			out = append(out, m)
		}
	}
	return out
}

func (s *session) startWarm() {
	if !s.warming {
		s.warming = true
		s.warmT.Reset(s.c.opts.WarmTimeout)
	}
}

func (s *session) stopWarm() {
	s.warming = false
	s.warmT.Stop()
}

// warmTimeout applies the accepted resources without what they still wait for.
func (s *session) warmTimeout() {
	s.warming = false
	c := s.c
	c.mu.Lock()
	acc := c.acc
	c.mu.Unlock()
	cfg, err := c.translate(acc)
	if err == nil {
		missing := s.waitingFor(acc, cfg)
		c.mu.Lock()
		for _, m := range missing {
			c.warmExpired[m] = true
		}
		c.mu.Unlock()
		c.mu.Lock()
		c.waiting = nil
		c.mu.Unlock()
		c.log.Warn("xds config applied without what it waited for", "missing", missing, "after", c.opts.WarmTimeout)
		err = c.opts.Apply(cfg)
	}
	if err != nil {
		c.setErr(fmt.Errorf("apply after warming: %w", err))
		c.log.Error("xds config rejected after warming; the previous config keeps serving", "err", err)
		return
	}
	c.mu.Lock()
	c.served, c.configVersion, c.lastUpdate, c.fromPersisted = acc, cfg.Version, time.Now(), false
	c.mu.Unlock()
	s.persist(acc, cfg.Version)
}

func (s *session) persist(st *store, version string) {
	c := s.c
	path := c.opts.Bootstrap.PersistPath
	if path == "" {
		return
	}
	if err := st.save(path, c.opts.Bootstrap.NodeID, version); err != nil {
		c.setErr(fmt.Errorf("persist: %w", err))
		c.log.Error("xds config not persisted", "file", path, "err", err)
	}
}

// reject NACKs a response, at once the first time its content is rejected and after a
// growing wait when the same content comes back (state-of-the-world servers resend a rejected
// snapshot at once, in a loop).
func (s *session) reject(u *update, problems []string) error {
	c := s.c
	r := s.rejects[u.typeURL]
	if r == nil || r.hash != u.hash {
		r = &rejection{hash: u.hash}
		s.rejects[u.typeURL] = r
	}
	r.n++
	delay := c.nackDelay(r.n)
	c.mu.Lock()
	c.lastNack[u.typeURL] = &NackStatus{At: time.Now(), Nonce: u.nonce, Version: u.version, Errors: problems, Repeats: r.n}
	c.lastErr, c.lastErrAt = fmt.Sprintf("%s rejected: %s", shortType(u.typeURL), summarize(problems)), time.Now()
	c.mu.Unlock()
	if r.n == 1 {
		c.log.Error("xds update rejected (NACK); the last good config keeps serving", "type", shortType(u.typeURL),
			"version", u.version, "problems", problems)
	} else {
		c.log.Debug("the same rejected xds update again; NACK after a back-off", "type", shortType(u.typeURL),
			"times", r.n, "wait", delay)
	}
	if delay <= 0 {
		return s.sendNack(u, problems)
	}
	s.pending[u.typeURL] = &pendingNack{at: time.Now().Add(delay), u: u, problems: problems}
	s.armNackTimer()
	return nil
}

// summarize is the first problem and how many more there are.
func summarize(p []string) string {
	if len(p) == 0 {
		return "rejected"
	}
	if len(p) == 1 {
		return p[0]
	}
	return fmt.Sprintf("%s (and %d more)", p[0], len(p)-1)
}

func (s *session) sendNack(u *update, problems []string) error {
	if err := s.st.nack(s, u, problems); err != nil {
		return fmt.Errorf("send NACK: %w", err)
	}
	s.c.mu.Lock()
	s.c.nacks[u.typeURL]++
	s.c.mu.Unlock()
	return nil
}

func (s *session) armNackTimer() {
	var next time.Time
	for _, p := range s.pending {
		if next.IsZero() || p.at.Before(next) {
			next = p.at
		}
	}
	s.nackT.Stop()
	if !next.IsZero() {
		s.nackT.Reset(max(time.Until(next), 0))
	}
}

// flushNacks sends the NACKs whose back-off is over.
func (s *session) flushNacks(now time.Time) error {
	for _, t := range sortedKeys(s.pending) {
		p := s.pending[t]
		if p.at.After(now) {
			continue
		}
		delete(s.pending, t)
		if err := s.sendNack(p.u, p.problems); err != nil {
			return err
		}
	}
	s.armNackTimer()
	return nil
}

// syncEDS subscribes to the endpoints of the clusters that use EDS, and only those.
func (s *session) syncEDS(acc *store) error {
	want := acc.edsNames()
	if slices.Equal(want, s.eds) && (s.asked || len(want) == 0) {
		return nil
	}
	if !s.asked && len(want) == 0 {
		return nil
	}
	if err := s.st.subscribeEDS(s, want); err != nil {
		return fmt.Errorf("update the endpoint subscription: %w", err)
	}
	s.c.log.Debug("xds endpoint subscription", "clusters", want)
	s.eds, s.asked = want, true
	return nil
}

// names is the resource_names of a state-of-the-world request of a type.
func (s *session) names(typeURL string) []string {
	switch typeURL {
	case typeEndpoint:
		return s.eds
	case typeRoute:
		return []string{s.c.opts.Bootstrap.RouteConfig}
	case typePolicy:
		return []string{PolicyName}
	}
	return nil // CDS: wildcard
}

func errorDetail(problems []string) *status.Status {
	return &status.Status{Code: int32(codes.InvalidArgument), Message: errorMessage(problems)}
}

// keep reports whether a resource of the response is one the client holds: the bootstrap's
// route configuration and the policy by name, everything else by type.
func (c *Client) keep(typeURL, name string) bool {
	switch typeURL {
	case typeRoute:
		return name == c.opts.Bootstrap.RouteConfig
	case typePolicy:
		return name == PolicyName
	}
	return true
}

// deltaStream is incremental xDS (DeltaAggregatedResources).
type deltaStream struct {
	s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	c *Client
}

func (d *deltaStream) recv() (*update, error) {
	r, err := d.s.Recv()
	if err != nil {
		return nil, err
	}
	u := &update{typeURL: r.GetTypeUrl(), version: r.GetSystemVersionInfo(), nonce: r.GetNonce(),
		removed: r.GetRemovedResources(), upserts: map[string]entry{}}
	if rc := d.c.opts.Bootstrap.RouteConfig; u.typeURL == typeRoute && slices.Contains(u.removed, rc) {
		// As Envoy does: a removed route configuration is ignored (logged), so a control
		// plane that drops and re-adds it does not take every replica's routes away.
		d.c.log.Warn("xds: removal of the route configuration ignored; the last one keeps serving", "route_config", rc)
		u.removed = slices.DeleteFunc(slices.Clone(u.removed), func(n string) bool { return n == rc })
	}
	raw := map[string]*anypb.Any{}
	for _, res := range r.GetResources() {
		if res.GetResource() == nil {
			continue // a heartbeat: the resource is unchanged
		}
		raw[res.GetName()] = res.GetResource()
		if !slices.Contains(clientTypes, u.typeURL) || !d.c.keep(u.typeURL, res.GetName()) {
			continue
		}
		msg, name, probs := decodeResource(u.typeURL, res.GetName(), res.GetResource())
		u.problems = append(u.problems, probs...)
		if len(probs) == 0 {
			u.upserts[name] = entry{version: res.GetVersion(), raw: res.GetResource(), msg: msg}
		}
	}
	u.hash = hashContent(u.typeURL, raw, u.removed)
	return u, nil
}

func (d *deltaStream) start(acc *store, eds []string) error {
	subs := map[string][]string{
		typeCluster: {"*"}, typeEndpoint: eds,
		typeRoute: {d.c.opts.Bootstrap.RouteConfig}, typePolicy: {PolicyName},
	}
	for i, t := range clientTypes {
		if t == typeEndpoint && len(eds) == 0 {
			continue // an empty first request would be a (legacy) wildcard
		}
		req := &discoveryv3.DeltaDiscoveryRequest{
			TypeUrl:                 t,
			ResourceNamesSubscribe:  subs[t],
			InitialResourceVersions: acc.resourceVersions(t),
		}
		if i == 0 {
			req.Node = d.c.node
		}
		if err := d.s.Send(req); err != nil {
			return err
		}
	}
	return nil
}

func (d *deltaStream) ack(_ *session, u *update) error {
	return d.s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: u.typeURL, ResponseNonce: u.nonce})
}

func (d *deltaStream) nack(_ *session, u *update, problems []string) error {
	return d.s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: u.typeURL, ResponseNonce: u.nonce, ErrorDetail: errorDetail(problems)})
}

func (d *deltaStream) subscribeEDS(s *session, want []string) error {
	var add, remove []string
	for _, n := range want {
		if !slices.Contains(s.eds, n) {
			add = append(add, n)
		}
	}
	for _, n := range s.eds {
		if !slices.Contains(want, n) {
			remove = append(remove, n)
		}
	}
	if len(add) == 0 && len(remove) == 0 {
		return nil
	}
	req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeEndpoint, ResourceNamesSubscribe: add, ResourceNamesUnsubscribe: remove}
	if !s.asked {
		req.Node = d.c.node
	}
	return d.s.Send(req)
}

// sotwStream is state-of-the-world xDS (StreamAggregatedResources).
type sotwStream struct {
	s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	c *Client
}

func (w *sotwStream) recv() (*update, error) {
	r, err := w.s.Recv()
	if err != nil {
		return nil, err
	}
	u := &update{typeURL: r.GetTypeUrl(), version: r.GetVersionInfo(), nonce: r.GetNonce(),
		upserts: map[string]entry{}, full: r.GetTypeUrl() == typeCluster}
	raw := map[string]*anypb.Any{}
	for i, a := range r.GetResources() {
		if !slices.Contains(clientTypes, u.typeURL) {
			raw[fmt.Sprint(i)] = a
			continue
		}
		msg, name, probs := decodeResource(u.typeURL, "", a)
		key := name
		if key == "" {
			key = fmt.Sprintf("#%d", i)
		}
		raw[key] = a
		if name != "" && !w.c.keep(u.typeURL, name) {
			continue // another route configuration or extension config: not ours
		}
		// A resource that does not decode has no name to tell whose it is: it is reported
		// (NACK) rather than dropped, since it may be ours.
		u.problems = append(u.problems, probs...)
		if len(probs) == 0 {
			if _, dup := u.upserts[name]; dup {
				u.problems = append(u.problems, fmt.Sprintf("%s %q: sent twice in one response", shortType(u.typeURL), name))
			}
			u.upserts[name] = entry{version: r.GetVersionInfo(), raw: a, msg: msg}
		}
	}
	u.hash = hashContent(u.typeURL, raw, nil)
	return u, nil
}

func (w *sotwStream) start(acc *store, eds []string) error {
	first := true
	for _, t := range clientTypes {
		var names []string
		switch t {
		case typeEndpoint:
			if len(eds) == 0 {
				continue // an empty first request would be a (legacy) wildcard
			}
			names = eds
		case typeRoute:
			names = []string{w.c.opts.Bootstrap.RouteConfig}
		case typePolicy:
			names = []string{PolicyName}
		}
		req := &discoveryv3.DiscoveryRequest{TypeUrl: t, VersionInfo: acc.versions[t], ResourceNames: names}
		if first {
			req.Node, first = w.c.node, false
		}
		if err := w.s.Send(req); err != nil {
			return err
		}
	}
	return nil
}

func (w *sotwStream) ack(s *session, u *update) error {
	return w.s.Send(&discoveryv3.DiscoveryRequest{
		TypeUrl: u.typeURL, VersionInfo: u.version, ResponseNonce: u.nonce, ResourceNames: s.names(u.typeURL),
	})
}

func (w *sotwStream) nack(s *session, u *update, problems []string) error {
	s.c.mu.Lock()
	version := s.c.acc.versions[u.typeURL]
	s.c.mu.Unlock()
	return w.s.Send(&discoveryv3.DiscoveryRequest{
		TypeUrl: u.typeURL, VersionInfo: version, ResponseNonce: u.nonce, ResourceNames: s.names(u.typeURL),
		ErrorDetail: errorDetail(problems),
	})
}

func (w *sotwStream) subscribeEDS(s *session, want []string) error {
	s.c.mu.Lock()
	version := s.c.acc.versions[typeEndpoint]
	s.c.mu.Unlock()
	return w.s.Send(&discoveryv3.DiscoveryRequest{
		TypeUrl: typeEndpoint, VersionInfo: version, ResponseNonce: s.nonces[typeEndpoint], ResourceNames: slices.Clone(want),
	})
}
