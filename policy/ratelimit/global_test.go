package ratelimit

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicegw/sluice/policy"
)

// fakeRLS is an in-process Envoy rate limit service.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu     sync.Mutex
	code   rlsv3.RateLimitResponse_Code
	reset  time.Duration
	limits []*rlsv3.RateLimitResponse_RateLimit // current_limit of descriptor i (nil: none), as Envoy's service sends it
	last   *rlsv3.RateLimitRequest
}

func (f *fakeRLS) ShouldRateLimit(_ context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last = r
	resp := &rlsv3.RateLimitResponse{OverallCode: f.code}
	for i := range r.GetDescriptors() {
		s := &rlsv3.RateLimitResponse_DescriptorStatus{Code: f.code}
		if f.code == rlsv3.RateLimitResponse_OVER_LIMIT && f.reset > 0 {
			s.DurationUntilReset = durationpb.New(f.reset)
		}
		if i < len(f.limits) {
			s.CurrentLimit = f.limits[i]
		}
		resp.Statuses = append(resp.Statuses, s)
	}
	return resp, nil
}

func (f *fakeRLS) set(code rlsv3.RateLimitResponse_Code, reset time.Duration) {
	f.mu.Lock()
	f.code, f.reset = code, reset
	f.mu.Unlock()
}

func (f *fakeRLS) setLimits(limits ...*rlsv3.RateLimitResponse_RateLimit) {
	f.mu.Lock()
	f.limits = limits
	f.mu.Unlock()
}

func (f *fakeRLS) lastRequest() *rlsv3.RateLimitRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

func startRLS(t *testing.T) (*fakeRLS, string, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRLS{code: rlsv3.RateLimitResponse_OK}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	var once sync.Once
	stop := func() { once.Do(func() { s.Stop(); <-done }) }
	t.Cleanup(stop)
	return f, lis.Addr().String(), stop
}

func TestGlobal(t *testing.T) {
	rls, addr, stop := startRLS(t)
	clock := newClock()
	l := newLimiter(t, Params{
		RequestsPerMinute: 100,
		TokensPerMinute:   100000,
		Global: &Global{
			Address: addr,
			Domain:  "gw",
			Timeout: policy.Duration(5 * time.Second), // generous: -race on 2 cores
			Descriptors: [][]GlobalEntry{
				{{Key: "tenant", From: FromTenant}, {Key: "model", From: FromModel}},
				{{Key: "route", From: FromRoute}, {Key: "kind", Value: "llm"}},
			},
			Hits: HitsTokens,
		},
	}, clock)

	// OK: admitted, and the request carries the descriptors and the token charge.
	d := admit(t, l, chat("team-a", "chat", 100, 50))
	if d.Reject != nil {
		t.Fatalf("OK: rejected %v", d.Reject)
	}
	d.Done(policy.Outcome{Status: 200, InputTokens: 100, OutputTokens: 50})
	req := rls.lastRequest()
	if req.GetDomain() != "gw" || req.GetHitsAddend() != 150 || len(req.GetDescriptors()) != 2 {
		t.Fatalf("request = %v", req)
	}
	got := map[string]string{}
	for _, desc := range req.GetDescriptors() {
		for _, e := range desc.GetEntries() {
			got[e.GetKey()] = e.GetValue()
		}
	}
	if got["tenant"] != "team-a" || got["model"] != "llama-3-8b" || got["route"] != "chat" || got["kind"] != "llm" {
		t.Errorf("descriptor entries = %v", got)
	}

	// OVER_LIMIT: 429 with the service's reset, and the local charge given back.
	rls.set(rlsv3.RateLimitResponse_OVER_LIMIT, 3*time.Second)
	d = admit(t, l, chat("", "chat", 100, 50))
	if d.Reject == nil || d.Reject.Status != 429 || d.Reject.RetryAfter != 3*time.Second || d.Reject.Type != "tokens" {
		t.Fatalf("OVER_LIMIT: %+v", d.Reject)
	}
	if got := rls.lastRequest().GetDescriptors()[0].GetEntries()[0].GetValue(); got != "anonymous" {
		t.Errorf("anonymous tenant sent as %q", got)
	}
	if d.Header.Get(HeaderRemainingRequests) != "100" || d.Header.Get(HeaderRemainingTokens) != "100000" {
		t.Errorf("local charge kept after a global rejection: %v", d.Header)
	}
	rls.set(rlsv3.RateLimitResponse_OVER_LIMIT, 0)
	if d := admit(t, l, chat("team-a", "chat", 1, 1)); d.Reject == nil || d.Reject.RetryAfter != time.Second {
		t.Errorf("OVER_LIMIT without reset: %+v", d.Reject)
	}

	// The service goes away: fail open, counted.
	stop()
	l.global.timeout = 200 * time.Millisecond
	for i := 0; i < 3; i++ {
		if d := admit(t, l, chat("team-a", "chat", 1, 1)); d.Reject != nil {
			t.Fatalf("service down: rejected %v", d.Reject)
		}
	}
	st := l.Stats()
	if st.GlobalCalls != 6 || st.GlobalFailures != 3 || st.Rejected[ReasonGlobal] != 2 || st.Admitted != 4 {
		t.Errorf("stats = %+v", st)
	}

	// A client that goes away is not a service failure.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Admit(ctx, chat("team-a", "chat", 1, 1)); err == nil {
		t.Error("canceled context: no error")
	}
	if st := l.Stats(); st.GlobalFailures != 3 || st.Rejected[ReasonCanceled] != 1 {
		t.Errorf("stats after cancel = %+v", st)
	}
}

func TestGlobalTimeoutFailsOpen(t *testing.T) {
	// A listener that accepts and never answers: every call times out.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		_ = lis.Close()
		wg.Wait()
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	l := newLimiter(t, Params{RequestsPerMinute: 10, Global: &Global{Address: lis.Addr().String(), Timeout: policy.Duration(30 * time.Millisecond)}}, newClock())
	start := time.Now()
	d := admit(t, l, chat("a", "chat", 1, 1))
	if d.Reject != nil {
		t.Fatalf("rejected: %v", d.Reject)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("took %v", el)
	}
	if st := l.Stats(); st.GlobalFailures != 1 {
		t.Errorf("stats = %+v", st)
	}
}

// TestGlobalRedialsDownServicePromptly: while the rate limit service is down every request
// is admitted unlimited (fail open), so the client redials it at least once a second, not on
// gRPC's default back-off (up to 2 minutes between attempts). Checked on the back-off the
// client dials with, worst case (full jitter up), without waiting on a clock: the first five
// redials of a service that went away all happen within 6 s (gRPC's default: 16 s and more).
func TestGlobalRedialsDownServicePromptly(t *testing.T) {
	worst := func(b backoff.Config, n int) time.Duration {
		var sum time.Duration
		d := float64(b.BaseDelay)
		for range n {
			sum += time.Duration(min(d, float64(b.MaxDelay)) * (1 + b.Jitter))
			d *= b.Multiplier
		}
		return sum
	}
	if w := worst(redial.Backoff, 5); w > 6*time.Second || redial.Backoff.MaxDelay > time.Second {
		t.Errorf("the first five redials may take %v (max delay %v): want within 6s, at most 1s apart", w, redial.Backoff.MaxDelay)
	}
	if w := worst(backoff.DefaultConfig, 5); w <= 6*time.Second {
		t.Errorf("the check cannot tell gRPC's default back-off (%v) from the client's", w)
	}
	// The client dials with it: a dialer that refuses every connection sees the attempts.
	var dials atomic.Int64
	refuse := func(ctx context.Context, _ string) (net.Conn, error) {
		dials.Add(1)
		return nil, errors.New("connection refused (test)")
	}
	g, err := newGlobalClient(Global{Address: "127.0.0.1:1", Timeout: policy.Duration(10 * time.Millisecond),
		Descriptors: [][]GlobalEntry{{{Key: "tenant", From: FromTenant}}}}, grpc.WithContextDialer(refuse))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = g.close() }()
	if _, err := g.check(context.Background(), "a", "chat", "m", 1); err == nil {
		t.Fatal("a call succeeded through a dialer that refuses every connection")
	}
	if dials.Load() == 0 {
		t.Error("the client did not dial through its dialer")
	}
}

// TestGlobalTooLarge: with hits: tokens, an OVER_LIMIT whose limit (the service's
// current_limit) is below the request's charge on its own can never pass: it is refused as a
// local too-large request is (429 tokens, no Retry-After, x-should-retry: false, counted
// under too_large), not with a Retry-After the client would wait out only to be refused (and
// counted against the tenant's window) again. Anything else stays an ordinary global 429.
func TestGlobalTooLarge(t *testing.T) {
	perMin := func(n uint32) *rlsv3.RateLimitResponse_RateLimit {
		return &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: n, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
	}
	for _, tc := range []struct {
		name    string
		hits    string
		limits  []*rlsv3.RateLimitResponse_RateLimit
		message string // too large: what the message must say; "": an ordinary global 429
	}{
		{"tokens over a per-minute limit", HitsTokens, []*rlsv3.RateLimitResponse_RateLimit{perMin(1000)},
			"Request too large for llama-3-8b on tokens per min (TPM) (global limit) for tenant a: Limit 1000, Requested 1500."},
		{"tokens over an hourly limit", HitsTokens, []*rlsv3.RateLimitResponse_RateLimit{{RequestsPerUnit: 1200, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR}},
			"on tokens per hour (global limit) for tenant a: Limit 1200, Requested 1500."},
		{"the smallest of two limits below the charge", HitsTokens, []*rlsv3.RateLimitResponse_RateLimit{perMin(1400), perMin(1000)},
			"Limit 1000, Requested 1500."},
		{"tokens over a limit the charge fits in", HitsTokens, []*rlsv3.RateLimitResponse_RateLimit{perMin(1500)}, ""},
		{"no limit in the answer", HitsTokens, nil, ""},
		{"requests with a limit of 0: blocked, not too large", HitsRequests, []*rlsv3.RateLimitResponse_RateLimit{perMin(0)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rls, addr, _ := startRLS(t)
			rls.set(rlsv3.RateLimitResponse_OVER_LIMIT, 30*time.Second)
			rls.setLimits(tc.limits...)
			descs := [][]GlobalEntry{{{Key: "tenant", From: FromTenant}}, {{Key: "route", From: FromRoute}}}
			l := newLimiter(t, Params{TokensPerMinute: 100000, Global: &Global{Address: addr, Timeout: policy.Duration(5 * time.Second),
				Hits: tc.hits, Descriptors: descs}}, newClock())
			d := admit(t, l, chat("a", "chat", 500, 1000))
			if d.Reject == nil || d.Reject.Status != 429 {
				t.Fatalf("reject = %+v, want a 429", d.Reject)
			}
			if d.Header.Get(HeaderRemainingTokens) != "100000" {
				t.Errorf("local charge kept: remaining %q", d.Header.Get(HeaderRemainingTokens))
			}
			st := l.Stats()
			if tc.message == "" {
				if d.Reject.RetryAfter != 30*time.Second || d.Header.Get(HeaderShouldRetry) != "" || st.Rejected[ReasonGlobal] != 1 || st.Rejected[ReasonTooLarge] != 0 {
					t.Errorf("ordinary global 429: Retry-After %v, x-should-retry %q, stats %+v", d.Reject.RetryAfter, d.Header.Get(HeaderShouldRetry), st)
				}
				return
			}
			if d.Reject.RetryAfter != 0 || d.Reject.Type != "tokens" || d.Header.Get(HeaderShouldRetry) != "false" {
				t.Errorf("too large: Retry-After %v, type %q, x-should-retry %q", d.Reject.RetryAfter, d.Reject.Type, d.Header.Get(HeaderShouldRetry))
			}
			if !strings.Contains(d.Reject.Message, tc.message) {
				t.Errorf("message %q, want it to contain %q", d.Reject.Message, tc.message)
			}
			if st.Rejected[ReasonTooLarge] != 1 || st.Rejected[ReasonGlobal] != 0 || st.GlobalCalls != 1 || st.GlobalFailures != 0 {
				t.Errorf("stats = %+v", st)
			}
		})
	}
	t.Run("no local limits", func(t *testing.T) {
		rls, addr, _ := startRLS(t)
		rls.set(rlsv3.RateLimitResponse_OVER_LIMIT, 30*time.Second)
		rls.setLimits(perMin(1000))
		l := newLimiter(t, Params{Global: &Global{Address: addr, Timeout: policy.Duration(5 * time.Second), Hits: HitsTokens}}, newClock())
		d := admit(t, l, chat("", "chat", 500, 1000))
		if d.Reject == nil || d.Header.Get(HeaderShouldRetry) != "false" || !strings.Contains(d.Reject.Message, "(global limit): Limit 1000, Requested 1500.") {
			t.Errorf("reject %+v, header %v", d.Reject, d.Header)
		}
	})
}
