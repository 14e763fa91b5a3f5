package upstream

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"time"
)

// healthLoop checks one endpoint every Interval until ctx is done. The first check comes
// after a random delay below min(Interval, 1s) so that endpoints are not all checked at once.
func (c *Cluster) healthLoop(ctx context.Context, e *Endpoint) {
	defer c.wg.Done()
	interval := c.opts.HealthCheck.Interval
	t := time.NewTimer(rand.N(min(interval, time.Second)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.checkOnce(ctx, e)
		t.Reset(interval)
	}
}

// maxHealthBody is how much of a health response body is read (and discarded) so that the
// connection can be reused.
const maxHealthBody = 64 << 10

// checkOnce runs one active check of e and records its result.
func (c *Cluster) checkOnce(ctx context.Context, e *Endpoint) {
	err := c.probe(ctx, e)
	if ctx.Err() != nil {
		return // stopping: a cancelled check says nothing about the endpoint
	}
	c.recordCheck(e, err)
}

func (c *Cluster) probe(ctx context.Context, e *Endpoint) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.HealthCheck.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.healthURL, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "sluice-health-check")
	resp, err := c.transport.t.RoundTrip(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxHealthBody))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errors.New("status " + resp.Status)
	}
	return nil
}

// recordCheck applies one check result to e's thresholds and logs a health transition.
func (c *Cluster) recordCheck(e *Endpoint, err error) {
	hc := c.opts.HealthCheck
	s := e.st
	s.mu.Lock()
	s.lastCheck = c.clock.Now()
	var changed, healthy bool
	if err == nil {
		s.lastCheckErr = ""
		s.hcFailures = 0
		s.hcSuccesses++
		if !s.healthy.Load() && s.hcSuccesses >= hc.HealthyThreshold {
			s.healthy.Store(true)
			changed, healthy = true, true
		}
	} else {
		s.lastCheckErr = err.Error()
		s.hcSuccesses = 0
		s.hcFailures++
		if s.healthy.Load() && s.hcFailures >= hc.UnhealthyThreshold {
			s.healthy.Store(false)
			changed = true
		}
	}
	s.mu.Unlock()
	switch {
	case changed && healthy:
		c.log.Info("upstream: endpoint healthy", "endpoint", e.raw)
	case changed:
		c.log.Warn("upstream: endpoint unhealthy", "endpoint", e.raw, "error", err,
			"consecutive_failures", hc.UnhealthyThreshold)
	}
}
