package upstream

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// healthLoop checks one endpoint every Interval until ctx is done, and asks a healthy one for
// its models every ModelsInterval. The first check comes
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
		if c.opts.DiscoverModels && e.Healthy() {
			c.maybeFetchModels(ctx, e)
		}
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

// probe runs one check of e. With several candidate paths (the default), the one found to
// exist is asked first; a path the server does not have (404, 405, 501) moves on to the next,
// which is remembered when it answers. Any other failure is the endpoint's.
func (c *Cluster) probe(ctx context.Context, e *Endpoint) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.HealthCheck.Timeout)
	defer cancel()
	n := len(e.healthURLs)
	first := int(e.st.healthIdx.Load()) % n
	var err error
	for k := range n {
		i := (first + k) % n
		var missing bool
		if missing, err = c.check(ctx, e.healthURLs[i]); !missing {
			if err == nil && i != first {
				e.st.healthIdx.Store(int32(i))
				c.log.Info("upstream: health checks use "+healthPath(e.healthURLs[i]), "endpoint", e.raw)
			}
			return err
		}
	}
	return err
}

// check GETs one health URL; missing reports that the server has no such path.
func (c *Cluster) check(ctx context.Context, u string) (missing bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("User-Agent", "sluice-health-check")
	if a := c.opts.Authorization; a != "" {
		req.Header.Set("Authorization", a)
	}
	resp, err := c.transport.t.RoundTrip(req)
	if err != nil {
		return false, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxHealthBody))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		switch resp.StatusCode {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
			missing = true
		}
		return missing, errors.New("GET " + healthPath(u) + ": status " + resp.Status)
	}
	return false, nil
}

// healthPath is the path part of a health URL, for messages.
func healthPath(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		if j := strings.IndexByte(u[i+3:], '/'); j >= 0 {
			return u[i+3+j:]
		}
	}
	return u
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
		s.passed.Store(true)
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
