package proxy

import (
	"net/http"
	"strings"

	"github.com/sluicegw/sluice/proxy/config"
)

// cors is the browser access the config allows (cors.allowed_origins): none by default.
// Sluice answers preflights itself and removes the model servers' own Access-Control-*
// headers (vLLM allows every origin unless told otherwise), so that only the configured
// origins can read answers in a browser.
type cors struct {
	any     bool
	origins map[string]bool
}

func newCORS(c config.CORS) cors {
	var co cors
	for _, o := range c.AllowedOrigins {
		if o == "*" {
			co.any = true
			continue
		}
		if co.origins == nil {
			co.origins = map[string]bool{}
		}
		co.origins[strings.ToLower(o)] = true
	}
	return co
}

// allows reports whether a page of origin may call the API.
func (c cors) allows(origin string) bool {
	return origin != "" && (c.any || c.origins[strings.ToLower(origin)])
}

// corsExposed are the answer headers a page may read.
const corsExposed = "X-Request-Id, X-Sluice-Upstream, X-Sluice-Attempts, X-Sluice-Budget-Exhausted, " +
	"X-Ratelimit-Limit-Requests, X-Ratelimit-Limit-Tokens, X-Ratelimit-Remaining-Requests, " +
	"X-Ratelimit-Remaining-Tokens, X-Ratelimit-Reset-Requests, X-Ratelimit-Reset-Tokens, Retry-After"

// setCORS sets the headers that let an allowed origin read the answer.
func setCORS(h http.Header, origin string) {
	h.Set("Access-Control-Allow-Origin", origin)
	h.Set("Access-Control-Expose-Headers", corsExposed)
	addVaryOrigin(h)
}

func addVaryOrigin(h http.Header) {
	for _, v := range h.Values("Vary") {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), "Origin") {
				return
			}
		}
	}
	h.Add("Vary", "Origin")
}

// preflight answers an OPTIONS request: 204, with the CORS allowance when its origin is
// allowed (the methods and headers the API needs), without one otherwise (the browser then
// refuses the call).
func (c cors) preflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Allow", "GET, POST, DELETE, OPTIONS")
	addVaryOrigin(h)
	if origin := r.Header.Get("Origin"); c.allows(origin) {
		h.Set("Access-Control-Allow-Origin", origin)
		h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
		if req := r.Header.Get("Access-Control-Request-Headers"); req != "" && len(req) <= 1024 {
			h.Set("Access-Control-Allow-Headers", req)
		}
		h.Set("Access-Control-Max-Age", "600")
	}
	w.WriteHeader(http.StatusNoContent)
}
