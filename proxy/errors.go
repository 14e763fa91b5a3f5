package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/sluicegw/sluice/proxy/openai"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// Error classes: why a request or an attempt failed. They label metrics and Outcomes.
const (
	classClientCancel  = "client_cancel"  // the client went away
	classClientStalled = "client_stalled" // the client stopped reading: a write to it exceeded the write time-out
	classBodyTimeout   = "body_timeout"   // the client did not send its body within the body time-out
	classTTFTTimeout   = "ttft_timeout"   // no first byte within the route's TTFT time-out
	classIdleTimeout   = "idle_timeout"   // no event within the idle time-out, mid-stream
	classTimeout       = "timeout"        // the route's total time-out
	classConnect       = "connect"        // could not connect to (or send to) the endpoint
	classNoEndpoint    = "no_endpoint"    // no healthy endpoint in the cluster
	classUpstream5xx   = "upstream_5xx"   // the model server answered 5xx
	classUpstream429   = "upstream_429"   // the model server answered 429
	classUpstream4xx   = "upstream_4xx"   // the model server answered another 4xx
	classStreamCut     = "stream_cut"     // the stream broke after it started
	classStreamError   = "stream_error"   // the model server reported an error in the stream, after it started
	classEmptyResponse = "upstream_empty" // the upstream closed before sending anything
	classShutdown      = "shutdown"       // the gateway's drain deadline passed
	classUpstreamError = "upstream_error" // the upstream's answer could not be relayed
	// classUpstreamProtocol: the model server's answer broke HTTP (malformed, a short or
	// broken body, oversized headers, a flood of 1xx): it was reached and may have done
	// the work, so this is not a connection failure.
	classUpstreamProtocol = "upstream_protocol"
	// classUpstreamMalformed: a successful answer not in the promised shape (not JSON, not an
	// event stream for a stream, an encoding not asked for).
	classUpstreamMalformed = "upstream_malformed"
	classBreakerOpen       = "breaker_open"    // the cluster's breaker is open
	classPerTryTimeout     = "per_try_timeout" // one attempt exceeded retry.per_try_timeout (or a step's total)
)

// statusClientClosed is nginx's 499: the client closed the request.
const statusClientClosed = 499

var (
	errTTFTTimeout  = errors.New("upstream sent no first byte within the TTFT time-out")
	errIdleTimeout  = errors.New("upstream sent nothing within the idle time-out")
	errTotalTimeout = errors.New("request exceeded the route's total time-out")
	errTryTimeout   = errors.New("attempt exceeded its per-try time-out")
	errShutdown     = errors.New("gateway is shutting down")
	errClientWrite  = errors.New("client went away")

	// errClientGone marks a request whose client went away: nothing is written back.
	errClientGone = &openai.Error{Status: statusClientClosed, Type: "invalid_request_error", Code: classClientCancel, Message: "client closed the request"}
)

// classError maps an error class to the status and OpenAI error the client gets. This is the
// one place where classes become statuses: 499 client gone, 504 upstream time-out, 503 no
// healthy endpoint or shutting down, 502 otherwise.
func classError(class string, retryAfter time.Duration) *openai.Error {
	switch class {
	case classClientCancel:
		return errClientGone
	case classTTFTTimeout:
		return openai.NewError(http.StatusGatewayTimeout, "timeout_error", class, "upstream sent no first token within the route's TTFT time-out")
	case classIdleTimeout:
		return openai.NewError(http.StatusGatewayTimeout, "timeout_error", class, "upstream stalled longer than the route's idle time-out")
	case classTimeout:
		return openai.NewError(http.StatusGatewayTimeout, "timeout_error", class, "request exceeded the route's total time-out")
	case classPerTryTimeout:
		return openai.NewError(http.StatusGatewayTimeout, "timeout_error", class, "the model server did not answer within the per-try time-out")
	case classNoEndpoint:
		e := openai.NewError(http.StatusServiceUnavailable, "server_error", class, "no healthy endpoint is available for this route")
		e.RetryAfter = retryAfter
		return e
	case classBreakerOpen:
		e := openai.NewError(http.StatusServiceUnavailable, "server_error", class, "the model server pool is failing and its breaker is open; retry later")
		e.RetryAfter = retryAfter
		return e
	case classShutdown:
		e := openai.NewError(http.StatusServiceUnavailable, "server_error", class, "the gateway is shutting down; retry on another replica")
		e.RetryAfter = time.Second
		return e
	case classConnect:
		return openai.NewError(http.StatusBadGateway, "server_error", class, "could not connect to the model server")
	case classStreamCut:
		return openai.NewError(http.StatusBadGateway, "server_error", class, "the model server's stream ended before completion")
	case classEmptyResponse:
		return openai.NewError(http.StatusBadGateway, "server_error", class, "the model server closed the connection without answering")
	default:
		return openai.NewError(http.StatusBadGateway, "server_error", classUpstreamError, "the model server's answer could not be relayed")
	}
}

// causeClass classifies why a context ended.
func causeClass(ctx context.Context) string {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errTTFTTimeout):
		return classTTFTTimeout
	case errors.Is(cause, errIdleTimeout):
		return classIdleTimeout
	case errors.Is(cause, errTotalTimeout):
		return classTimeout
	case errors.Is(cause, errTryTimeout):
		return classPerTryTimeout
	case errors.Is(cause, errShutdown):
		return classShutdown
	default:
		return classClientCancel
	}
}

// transportClass classifies an error from the upstream transport: the context's cause when it
// ended, otherwise a connection problem (refused, reset, TLS, dial time-out).
func transportClass(ctx context.Context) string {
	if ctx.Err() != nil {
		return causeClass(ctx)
	}
	return classConnect
}

// protocolFailure reports whether a transport error means the model server was reached and
// broke HTTP, rather than that it could not be reached: any error that is not a network
// operation failing (dial, a reset, a refused connection, a time-out), a TLS handshake
// failure, or a connection closed before any answer (which a server closing an idle
// keep-alive connection also causes, and which is safe to retry).
func protocolFailure(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	var cert *tls.CertificateVerificationError
	var rec tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case errors.As(err, &op), errors.As(err, &dns), errors.As(err, &cert), errors.As(err, &rec), errors.As(err, &alert):
		return false
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	// A keep-alive connection the server closed as the request was sent on it: nothing ran.
	return !strings.Contains(err.Error(), "server closed idle connection")
}

// statusClass is the class of a model server's answer by its status ("" for a success, below
// 400) and whether another attempt may follow it: a 5xx or a 429 may be retried (another
// endpoint, another cluster), any other 4xx is the request's own and goes back to the client.
// The one place where an upstream status becomes a class: attempts, batched requests and
// the mirror's copies all use it.
func statusClass(status int) (class string, retryable bool) {
	switch {
	case status >= 500:
		return classUpstream5xx, true
	case status == http.StatusTooManyRequests:
		return classUpstream429, true
	case status >= 400:
		return classUpstream4xx, false
	}
	return "", false
}

// reportStatus tells the endpoint's outlier detection how it answered: a 5xx is a failure, a
// 429 neither (the server is busy, not broken), anything else a success.
func reportStatus(ep *upstream.Endpoint, status int) {
	switch {
	case status >= 500:
		ep.Report(false)
	case status != http.StatusTooManyRequests:
		ep.Report(true)
	}
}
