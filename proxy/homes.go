package proxy

import (
	"strings"
	"sync"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
)

// Stored Responses answers live on the model server that made them (vLLM keeps them in its
// own memory): a follow-up that names one — previous_response_id, or GET/DELETE
// /v1/responses/{id} — must reach that server. Sluice remembers where each answer it relayed
// was made, bounded, and sends the follow-up there: its home cluster only (another cluster
// does not hold the answer, so there is nothing to fall back to) and its home endpoint while
// that is available.

// maxHomes bounds the remembered answers; the oldest are forgotten first.
const maxHomes = 32768

// home is where a stored answer lives.
type home struct{ cluster, endpoint string }

// homes remembers the home of the last maxHomes stored answers. It lives across reloads.
type homes struct {
	mu    sync.Mutex
	m     map[string]home
	ring  []string // ids in insertion order, a ring of maxHomes
	next  int
	limit int
}

func newHomes(limit int) *homes {
	return &homes{m: make(map[string]home), limit: limit}
}

// put remembers id's home, forgetting the oldest when full.
func (h *homes) put(id string, at home) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.m[id]; ok {
		h.m[id] = at
		return
	}
	if len(h.ring) < h.limit {
		h.ring = append(h.ring, id)
	} else {
		delete(h.m, h.ring[h.next])
		h.ring[h.next] = id
		h.next = (h.next + 1) % h.limit
	}
	h.m[id] = at
}

// get returns id's home.
func (h *homes) get(id string) (home, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.m[id]
	return at, ok
}

// storedID is the id of a stored answer the request refers to: its previous_response_id, or
// the {id} of GET/DELETE /v1/responses/{id}[/…]; "" when none.
func storedID(r *policy.Request, urlPath string) string {
	if r.Kind == openai.KindResponses {
		return r.PreviousResponseID
	}
	if rest, ok := strings.CutPrefix(urlPath, "/v1/responses/"); ok {
		id, _, _ := strings.Cut(rest, "/")
		return id
	}
	return ""
}

// stores reports whether a Responses answer to r is stored by its server (store defaults to
// true, as OpenAI's and vLLM's with a store do).
func stores(r *policy.Request) bool {
	return r.Kind == openai.KindResponses && (r.Store == nil || *r.Store)
}

// homePlan pins a plan to the home of the stored answer the request refers to: the plan's
// candidate on the home cluster (or one for it), alone. ok is false when the request refers
// to none, or to one Sluice did not see made (the plan stands).
func (st *state) homePlan(hs *homes, rt *config.CompiledRoute, r *policy.Request, urlPath string, plan []policy.Candidate) (pinned []policy.Candidate, endpoint string, ok bool) {
	id := storedID(r, urlPath)
	if id == "" {
		return plan, "", false
	}
	at, found := hs.get(id)
	if !found || st.clusters[at.cluster] == nil {
		return plan, "", false
	}
	for _, c := range plan {
		if c.Cluster == at.cluster {
			return []policy.Candidate{c}, at.endpoint, true
		}
	}
	// Another split of the route made it (a gray flag, a weight change, no session key):
	// that split's candidate, with its model rewrite and time-outs.
	if c, ok := st.routers[rt.Index].CandidateFor(at.cluster); ok {
		return []policy.Candidate{c}, at.endpoint, true
	}
	return []policy.Candidate{{Cluster: at.cluster}}, at.endpoint, true
}
