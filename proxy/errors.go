package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/proxy/scope"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// statusClientClosed is nginx's 499: the client closed the request.
const statusClientClosed = policy.StatusClientClosed

var (
	errTTFTTimeout  = errors.New("upstream sent no first byte within the TTFT time-out")
	errIdleTimeout  = errors.New("upstream sent nothing within the idle time-out")
	errTotalTimeout = errors.New("request exceeded the route's total time-out")
	errTryTimeout   = errors.New("attempt exceeded its per-try time-out")
	errShutdown     = errors.New("gateway is shutting down")
	errClientWrite  = errors.New("client went away")
)

// classFailure is the failure of a class the gateway detects itself, with the class table's
// status and message; a class outside the table is an answer that could not be relayed. A
// failure that says a pool is unavailable carries retryAfter (shutting down: one second).
func classFailure(class policy.Class, retryAfter time.Duration) *policy.Failure {
	if !class.Known() {
		class = policy.ClassUpstreamError
	}
	f := policy.Fail(class, "")
	switch class {
	case policy.ClassNoEndpoint, policy.ClassBreakerOpen:
		f.RetryAfter = retryAfter
	case policy.ClassShutdown:
		f.RetryAfter = time.Second
	}
	return f
}

// clientSide reports whether a class is the client's own end (gone, or not reading): nothing
// more is written to it.
func clientSide(c policy.Class) bool {
	return c == policy.ClassClientCancel || c == policy.ClassClientStalled
}

// causeClass classifies why a context ended.
func causeClass(ctx context.Context) policy.Class {
	switch cause := scope.Cause(ctx); {
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
func transportClass(ctx context.Context) policy.Class {
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

// upstreamFailure is the failure of a model server's error answer (status 400–599), which the
// client gets as the server sent it unless another attempt replaces it.
func upstreamFailure(status int) *policy.Failure {
	class := policy.UpstreamClass(status)
	f := policy.Fail(class, "the model server answered "+strconv.Itoa(status))
	f.Status = status
	return f
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

// attemptFailure is the failure of an attempt that ended on a time-out, the client going away
// or the transport, the cause err kept for logs. The attempt's own per-try time-out is retried
// and moved on like a TTFT time-out (its class), and the client reads which one it was (its
// code and message).
func attemptFailure(class policy.Class, err error) *policy.Failure {
	f := classFailure(class, 0)
	f.Err = err
	if class == policy.ClassPerTryTimeout {
		f.Class = policy.ClassTTFTTimeout
	}
	return f
}
