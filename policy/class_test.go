package policy

import (
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

func TestClassTable(t *testing.T) {
	for _, c := range Classes() {
		i := c.Info()
		if i.Status < 400 || i.Status > 599 || i.Type == "" || i.Message == "" {
			t.Errorf("%s: row %+v", c, i)
		}
		if strings.ToLower(string(c)) != string(c) || strings.ContainsAny(string(c), " -") {
			t.Errorf("%s: a class is a snake_case label", c)
		}
	}
	// The design's rule: 499 client gone, 504 upstream time-out, 503 breaker open or no
	// healthy endpoint, 429 rate limit or queue full, 413 prompt too large, 400 bad request.
	for c, want := range map[Class]int{
		ClassClientCancel: StatusClientClosed, ClassTTFTTimeout: 504, ClassTimeout: 504, ClassBreakerOpen: 503,
		ClassNoEndpoint: 503, ClassRateLimited: 429, ClassConcurrencyLimit: 429, ClassPromptTooLarge: 413,
		ClassInvalidJSON: 400, ClassConnect: 502, ClassNoRoute: 404, ClassFaultNotAllowed: 403,
	} {
		if got := c.Info().Status; got != want {
			t.Errorf("%s: status %d, want %d", c, got, want)
		}
	}
	if !ClassConnect.Known() || Class("never-heard-of").Known() {
		t.Error("Known disagrees with the table")
	}
	if i := Class("never-heard-of").Info(); i.Status != http.StatusBadGateway || i.Type != "server_error" {
		t.Errorf("unknown class: %+v", i)
	}
}

func TestFailure(t *testing.T) {
	cause := errors.New("dial tcp: refused")
	f := Failf(ClassConnect, cause, "")
	if f.Status != 502 || f.Type != "server_error" || f.Code != "connect" || f.Message != ClassConnect.Info().Message {
		t.Errorf("Failf = %+v", f)
	}
	if !errors.Is(f, cause) || f.Error() != "502 connect: could not connect to the model server" {
		t.Errorf("error %q does not wrap its cause", f.Error())
	}
	if !f.Retryable() {
		t.Error("a connection failure before the first byte is retryable")
	}
	f.Phase = InStream
	if f.Retryable() {
		t.Error("a failure in the stream is never retried")
	}
	if Fail(ClassUpstream4xx, "").Retryable() || Fail(ClassTimeout, "").Retryable() || (*Failure)(nil).Retryable() {
		t.Error("the request's own 4xx, the total time-out and no failure are not retryable")
	}

	r := Fail(ClassRateLimited, "slow down")
	r.Type, r.RetryAfter, r.Param = "tokens", 3*time.Second, "max_tokens"
	e := r.OpenAI()
	if e.Status != 429 || e.Type != "tokens" || e.Code != "rate_limit_exceeded" || e.Message != "slow down" || e.RetryAfter != 3*time.Second || e.Param != "max_tokens" {
		t.Errorf("OpenAI() = %+v", e)
	}
	back := FromOpenAI(openai.NewError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "too big"))
	if back.Class != ClassTooLarge || back.Status != 413 || back.Message != "too big" || back.Class.Info().Status != back.Status {
		t.Errorf("FromOpenAI = %+v", back)
	}
}

// TestClassesDocumented: docs/metrics.md lists every class with its status.
func TestClassesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range Classes() {
		row := "| `" + string(c) + "` | " + strconv.Itoa(c.Info().Status) + " |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/metrics.md has no row %q", row)
		}
	}
}

func TestUpstreamClass(t *testing.T) {
	for _, tt := range []struct {
		status    int
		class     Class
		retryable bool
	}{
		{200, "", false}, {204, "", false}, {399, "", false},
		{400, ClassUpstream4xx, false}, {404, ClassUpstream4xx, false}, {413, ClassUpstream4xx, false},
		{429, ClassUpstream429, true},
		{500, ClassUpstream5xx, true}, {503, ClassUpstream5xx, true}, {599, ClassUpstream5xx, true},
	} {
		c := UpstreamClass(tt.status)
		if c != tt.class || (c != "" && c.Info().Retryable != tt.retryable) {
			t.Errorf("UpstreamClass(%d) = %q (retryable %v); want %q, %v", tt.status, c, c != "" && c.Info().Retryable, tt.class, tt.retryable)
		}
	}
}
