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

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/proxy/openai"
	"github.com/sluicegw/sluice/proxy/upstream"
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
	errClientGone = &openai.Error{Status: statusClientClosed, Type: "invalid_request_error", Code: policy.ClassClientCancel, Message: "client closed the request"}
)

// classError maps an error class to the status and OpenAI error the client gets. This is the
// one place where classes become statuses: 499 client gone, 504 upstream time-out, 503 no
// healthy endpoint or shutting down, 502 otherwise.
func classError(class string, retryAfter time.Duration) *openai.Error {
	switch class {
	case policy.ClassClientCancel:
		return errClientGone
	case policy.ClassTTFTTimeout:
		return openai.NewError(http.StatusGatewayTimeout, "timeout_error", class, "upstream sent no first token within the route's TTFT time-out")
	case policy.ClassIdleTimeout:
		return openai.NewError(http.StatusGatewayTimeout, "timeout_error", class, "upstream stalled longer than the route's idle time-out")
	case policy.ClassTimeout:
		return openai.NewError(http.StatusGatewayTimeout, "timeout_error", class, "request exceeded the route's total time-out")
	case policy.ClassPerTryTimeout:
		return openai.NewError(http.StatusGatewayTimeout, "timeout_error", class, "the model server did not answer within the per-try time-out")
	case policy.ClassNoEndpoint:
		e := openai.NewError(http.StatusServiceUnavailable, "server_error", class, "no healthy endpoint is available for this route")
		e.RetryAfter = retryAfter
		return e
	case policy.ClassBreakerOpen:
		e := openai.NewError(http.StatusServiceUnavailable, "server_error", class, "the model server pool is failing and its breaker is open; retry later")
		e.RetryAfter = retryAfter
		return e
	case policy.ClassShutdown:
		e := openai.NewError(http.StatusServiceUnavailable, "server_error", class, "the gateway is shutting down; retry on another replica")
		e.RetryAfter = time.Second
		return e
	case policy.ClassConnect:
		return openai.NewError(http.StatusBadGateway, "server_error", class, "could not connect to the model server")
	case policy.ClassStreamCut:
		return openai.NewError(http.StatusBadGateway, "server_error", class, "the model server's stream ended before completion")
	case policy.ClassEmptyResponse:
		return openai.NewError(http.StatusBadGateway, "server_error", class, "the model server closed the connection without answering")
	default:
		return openai.NewError(http.StatusBadGateway, "server_error", policy.ClassUpstreamError, "the model server's answer could not be relayed")
	}
}

// causeClass classifies why a context ended.
func causeClass(ctx context.Context) string {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errTTFTTimeout):
		return policy.ClassTTFTTimeout
	case errors.Is(cause, errIdleTimeout):
		return policy.ClassIdleTimeout
	case errors.Is(cause, errTotalTimeout):
		return policy.ClassTimeout
	case errors.Is(cause, errTryTimeout):
		return policy.ClassPerTryTimeout
	case errors.Is(cause, errShutdown):
		return policy.ClassShutdown
	default:
		return policy.ClassClientCancel
	}
}

// transportClass classifies an error from the upstream transport: the context's cause when it
// ended, otherwise a connection problem (refused, reset, TLS, dial time-out).
func transportClass(ctx context.Context) string {
	if ctx.Err() != nil {
		return causeClass(ctx)
	}
	return policy.ClassConnect
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
		return policy.ClassUpstream5xx, true
	case status == http.StatusTooManyRequests:
		return policy.ClassUpstream429, true
	case status >= 400:
		return policy.ClassUpstream4xx, false
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
