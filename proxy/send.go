package proxy

import (
	"context"
	"net/http"
	"strings"

	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/httphead"
)

// The send step (8 in the picture) is one way out to a model server, for the request's
// attempts and its mirrored copies alike: bodyFor writes the candidate's model into the
// body, send puts the cluster's credential on the request and sends it with the attempt's
// chaos faults standing in for the model server (a delay, an abort answer) and acting on
// the body it answers with (stream faults). The caller builds the request (which headers
// go: the client's for an attempt, the mirror's filtered set for a copy) and reads the
// answer (the relay for an attempt, the capture for a copy).

// stripCredentials removes every credential-like header (config.CredentialLike).
func stripCredentials(h http.Header) {
	for k := range h {
		if config.CredentialLike(k) {
			delete(h, k)
		}
	}
}

// bodyFor is the body sent to a candidate serving model ("" keeps the request's): the
// request's body, with the model rewritten when the candidate names another. It returns the
// model the body names.
func bodyFor(body []byte, reqModel, model string) ([]byte, string, error) {
	if model == "" || model == reqModel || body == nil {
		return body, reqModel, nil
	}
	b, err := openai.SetModel(body, model)
	if err != nil {
		return nil, "", err
	}
	return b, model, nil
}

// send sends out to the cluster, unless the attempt's chaos faults answer for the model
// server (an abort) or delay it first; a successful answer's body comes wrapped with the
// attempt's stream faults. sse reports whether the answer is an event stream.
//
// The credential rule, for attempts and copies alike: a cluster with a credential (api_key)
// gets its own and none of the client's (all of them, not only Authorization: api-key,
// x-api-key, cookies, vendor key headers); a cluster without one gets what the caller put on
// the request (an attempt: the client's; a copy: none, mirrorHeader removed them).
func send(ctx context.Context, at *fault.Attempt, cl *clusterState, out *http.Request) (resp *http.Response, sse bool, err error) {
	if cl.apiKey != "" {
		stripCredentials(out.Header)
		out.Header.Set("Authorization", "Bearer "+cl.apiKey)
	}
	ab, err := at.Before(ctx)
	switch {
	case err != nil:
		return nil, false, err
	case ab != nil:
		resp = ab.Response(out)
	default:
		if resp, err = cl.Transport().RoundTrip(out); err != nil {
			return nil, false, err
		}
	}
	sse = strings.HasPrefix(httphead.Get(resp.Header, "Content-Type"), "text/event-stream")
	if resp.StatusCode < 300 {
		resp.Body = at.WrapUpstream(ctx, resp.Body, sse)
	}
	return resp, sse, nil
}
