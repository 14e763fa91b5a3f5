package ratelimit

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// defaultGlobalRetry is the Retry-After of a global OVER_LIMIT that names no reset time.
const defaultGlobalRetry = time.Second

// redial is how the client reconnects to a service that went away: soon, and then at least
// once a second however long it stays down. Every request fails open (unlimited) until the
// next attempt connects, and gRPC's default (1s, then × 1.6 up to 2 minutes) would keep a
// fleet unlimited for up to 2 minutes after the service is back. A refused dial costs
// nothing much; one that hangs is cut by MinConnectTimeout.
var redial = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// globalClient asks an Envoy-compatible rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit). It is tested against
// Envoy's own (github.com/envoyproxy/ratelimit, on Redis) in test/fleet.
type globalClient struct {
	conn       *grpc.ClientConn
	client     rlsv3.RateLimitServiceClient
	domain     string
	timeout    time.Duration
	descs      [][]GlobalEntry
	hitsTokens bool
	failing    atomic.Bool // for logging transitions only
}

func newGlobalClient(g Global, opts ...grpc.DialOption) (*globalClient, error) {
	// grpc.NewClient does not connect: the first call does, and fails open if it cannot.
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(redial),
	}, opts...)
	conn, err := grpc.NewClient(g.Address, opts...)
	if err != nil {
		return nil, err
	}
	return &globalClient{
		conn:       conn,
		client:     rlsv3.NewRateLimitServiceClient(conn),
		domain:     g.Domain,
		timeout:    g.Timeout.D(),
		descs:      g.Descriptors,
		hitsTokens: g.Hits == HitsTokens,
	}, nil
}

func (g *globalClient) close() error { return g.conn.Close() }

// ok notes a successful call (logging the recovery once).
func (g *globalClient) ok(log *slog.Logger) {
	if g.failing.CompareAndSwap(true, false) {
		log.Info("ratelimit: global rate limit service answering again")
	}
}

// verdict is the service's answer to one call.
type verdict struct {
	over  bool          // OVER_LIMIT
	retry time.Duration // with over: the longest reset the service names (1s if none)
	// tooLarge, with hits: tokens, is the smallest limit the service answered OVER_LIMIT
	// with that is below the request's charge on its own: no window can ever admit it.
	tooLarge *rlsv3.RateLimitResponse_RateLimit
}

// check asks the service. err is non-nil when the service failed or timed out.
func (g *globalClient) check(ctx context.Context, tenant, route, model string, hits uint32) (v verdict, err error) {
	req := &rlsv3.RateLimitRequest{Domain: g.domain, HitsAddend: hits}
	req.Descriptors = make([]*commonrl.RateLimitDescriptor, len(g.descs))
	for i, d := range g.descs {
		entries := make([]*commonrl.RateLimitDescriptor_Entry, len(d))
		for j, e := range d {
			v := e.Value
			switch e.From {
			case FromTenant:
				v = tenant
				if v == "" {
					v = "anonymous"
				}
			case FromRoute:
				v = route
			case FromModel:
				v = model
			}
			entries[j] = &commonrl.RateLimitDescriptor_Entry{Key: e.Key, Value: v}
		}
		req.Descriptors[i] = &commonrl.RateLimitDescriptor{Entries: entries}
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	resp, err := g.client.ShouldRateLimit(ctx, req)
	if err != nil {
		return verdict{}, err
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		return verdict{}, nil
	}
	v.over = true
	for _, s := range resp.GetStatuses() {
		if s.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			continue
		}
		if s.GetDurationUntilReset() != nil {
			v.retry = max(v.retry, s.GetDurationUntilReset().AsDuration())
		}
		// Envoy's service sends the limit it applied; a charge above it (the counter went
		// over with this request alone) can never pass. With hits: requests, one hit over a
		// limit is a limit of 0: blocked, not too large.
		if lim := s.GetCurrentLimit(); g.hitsTokens && lim != nil && hits > lim.GetRequestsPerUnit() &&
			(v.tooLarge == nil || lim.GetRequestsPerUnit() < v.tooLarge.GetRequestsPerUnit()) {
			v.tooLarge = lim
		}
	}
	if v.retry <= 0 {
		v.retry = defaultGlobalRetry
	}
	return v, nil
}
