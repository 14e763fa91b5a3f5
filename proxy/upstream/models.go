package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Model is one model an endpoint advertises on GET /v1/models.
type Model struct {
	ID string
	// MaxModelLen is the context window the server advertises (vLLM's max_model_len;
	// llama.cpp's meta.n_ctx_train is not a serving limit and is not read), 0 when it says
	// none.
	MaxModelLen int
	// Raw is the model object as the server wrote it (vendor fields kept), bounded.
	Raw json.RawMessage
}

// Bounds of model discovery: whatever an endpoint answers, a cluster holds at most
// maxModels models per endpoint, each id at most maxModelID bytes and each object at most
// maxModelObject bytes, read from at most maxModelsBody bytes.
const (
	maxModelsBody  = 1 << 20
	maxModels      = 512
	maxModelID     = 256
	maxModelObject = 4 << 10
	// ModelsInterval is how often the active health checks also ask an endpoint for its
	// models.
	ModelsInterval = 30 * time.Second
	// modelsRetry is how soon an endpoint whose list could not be fetched is asked again
	// (however many requests want it meanwhile).
	modelsRetry = 5 * time.Second
)

// Models returns the models the cluster's endpoints advertise, each id once (the first
// endpoint's object wins), in endpoint then list order. Discovery runs with the active
// health checks (every ModelsInterval) and on RefreshModels; a cluster never asked has none.
func (c *Cluster) Models() []Model {
	var out []Model
	seen := map[string]bool{}
	for _, e := range c.endpoints {
		ms := e.st.models.Load()
		if ms == nil {
			continue
		}
		for _, m := range *ms {
			if !seen[m.ID] {
				seen[m.ID] = true
				out = append(out, m)
			}
		}
	}
	return out
}

// MaxModelLen is the smallest context window the cluster's endpoints advertise for model, 0
// when none does. It allocates nothing (it runs on the request path).
func (c *Cluster) MaxModelLen(model string) int {
	n := 0
	for _, e := range c.endpoints {
		ms := e.st.models.Load()
		if ms == nil {
			continue
		}
		for i := range *ms {
			if m := &(*ms)[i]; m.ID == model && m.MaxModelLen > 0 && (n == 0 || m.MaxModelLen < n) {
				n = m.MaxModelLen
			}
		}
	}
	return n
}

// HasModel reports whether an endpoint of the cluster advertises model. It allocates nothing.
func (c *Cluster) HasModel(model string) bool {
	for _, e := range c.endpoints {
		if ms := e.st.models.Load(); ms != nil {
			for i := range *ms {
				if (*ms)[i].ID == model {
					return true
				}
			}
		}
	}
	return false
}

// Discovered reports whether any endpoint's models were fetched.
func (c *Cluster) Discovered() bool {
	for _, e := range c.endpoints {
		if e.st.models.Load() != nil {
			return true
		}
	}
	return false
}

// RefreshModels asks every endpoint whose models are unknown or older than ModelsInterval
// for them now, one after another, within ctx. It returns the first error (the others'
// lists are still updated).
func (c *Cluster) RefreshModels(ctx context.Context) error {
	var first error
	for _, e := range c.endpoints {
		if !c.modelsDue(e) {
			continue
		}
		if err := c.refresh(ctx, e); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// modelsDue reports whether e's models should be asked for: never asked, or asked longer
// than ModelsInterval ago (a failed ask counts as made modelsRetry before the interval ends).
func (c *Cluster) modelsDue(e *Endpoint) bool {
	at := e.st.modelsAt.Load()
	return at == 0 || c.clock.Now().UnixNano()-at >= int64(ModelsInterval)
}

// refresh fetches e's models, once for all callers: a caller arriving while a fetch is in
// flight waits for it (or for its ctx) instead of sending another.
func (c *Cluster) refresh(ctx context.Context, e *Endpoint) error {
	s := e.st
	s.mu.Lock()
	if ch := s.modelsFetch; ch != nil {
		s.mu.Unlock()
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if !c.modelsDue(e) {
		// A fetch ended between the caller's check and here: its answer (or its retry
		// back-off) stands.
		s.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	s.modelsFetch = ch
	s.mu.Unlock()
	err := c.fetchModels(ctx, e)
	if err != nil && ctx.Err() == nil {
		// Not again for modelsRetry, however many requests want it.
		s.modelsAt.Store(c.clock.Now().UnixNano() - int64(ModelsInterval) + int64(modelsRetry))
	}
	s.mu.Lock()
	s.modelsFetch = nil
	s.mu.Unlock()
	close(ch)
	return err
}

// maybeFetchModels fetches e's models when they are due (from the health loop).
func (c *Cluster) maybeFetchModels(ctx context.Context, e *Endpoint) {
	if !c.modelsDue(e) {
		return
	}
	if err := c.refresh(ctx, e); err != nil && ctx.Err() == nil {
		c.log.Debug("upstream: model discovery failed", "endpoint", e.raw, "error", err)
	}
}

// fetchModels GETs e's /v1/models and keeps the list. A failed fetch keeps the last good
// list (a server busy for a moment still serves its models) but is retried next time.
func (c *Cluster) fetchModels(ctx context.Context, e *Endpoint) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.HealthCheck.Timeout+time.Second)
	defer cancel()
	u := strings.TrimSuffix(e.url.String(), "/") + "/v1/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "sluice-model-discovery")
	req.Header.Set("Accept", "application/json")
	if a := c.opts.Authorization; a != "" {
		req.Header.Set("Authorization", a)
	}
	resp, err := c.transport.t.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxModelsBody+1))
	if err != nil {
		return fmt.Errorf("GET /v1/models: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode == http.StatusNotFound {
			// A server without the endpoint: nothing to learn, do not ask on every check.
			e.st.modelsAt.Store(c.clock.Now().UnixNano())
		}
		return fmt.Errorf("GET /v1/models: status %s", resp.Status)
	}
	if len(body) > maxModelsBody {
		return fmt.Errorf("GET /v1/models: answer larger than %d bytes", maxModelsBody)
	}
	ms, err := ParseModels(body)
	if err != nil {
		return fmt.Errorf("GET /v1/models: %w", err)
	}
	e.st.models.Store(&ms)
	e.st.modelsAt.Store(c.clock.Now().UnixNano())
	return nil
}

// ParseModels reads an OpenAI model list ({"object":"list","data":[{"id":…},…]}), keeping at
// most maxModels models with a non-empty id of at most maxModelID bytes; objects larger than
// maxModelObject keep only their id (and max_model_len).
func ParseModels(body []byte) ([]Model, error) {
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("not a model list: %w", err)
	}
	if list.Data == nil {
		return nil, errors.New("not a model list: no data array")
	}
	out := make([]Model, 0, min(len(list.Data), maxModels))
	for _, raw := range list.Data {
		if len(out) == maxModels {
			break
		}
		var m struct {
			ID          string  `json:"id"`
			MaxModelLen float64 `json:"max_model_len"`
		}
		if json.Unmarshal(raw, &m) != nil || m.ID == "" || len(m.ID) > maxModelID {
			continue
		}
		mm := Model{ID: m.ID}
		if m.MaxModelLen >= 1 && m.MaxModelLen <= 1<<31-1 {
			mm.MaxModelLen = int(m.MaxModelLen)
		}
		if len(raw) <= maxModelObject && raw[0] == '{' {
			mm.Raw = append(json.RawMessage(nil), raw...)
		} else {
			mm.Raw, _ = json.Marshal(map[string]any{"id": m.ID, "object": "model", "max_model_len": mm.MaxModelLen})
		}
		out = append(out, mm)
	}
	return out, nil
}
