package rlstest

import (
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// Window is the service's counting window for a limit of unit "minute": it counts in fixed
// calendar minutes (the Redis key names the window's start), not in a sliding minute.
const Window = time.Minute

// WindowTries is how many runs InOneWindow makes at most.
const WindowTries = 3

// SameWindow reports whether start and end fall in one fixed window of length w (aligned on
// the Unix epoch, as the service aligns its windows).
func SameWindow(start, end time.Time, w time.Duration) bool {
	return start.UnixNano()/int64(w) == end.UnixNano()/int64(w)
}

// InOneWindow runs a budget phase, and again (WindowTries runs at most) while a run
// straddled a boundary of the service's fixed windows (Window): a phase that spans two
// windows has two budgets. try counts the runs from 0: each run must count against a fresh
// descriptor (another tenant), the previous runs' having spent budget. The service runs on
// this host, so its clock is this one.
func InOneWindow[T any](t testing.TB, phase func(try int) T) T {
	t.Helper()
	for try := range WindowTries {
		start := time.Now()
		res := phase(try)
		end := time.Now()
		if SameWindow(start, end, Window) {
			return res
		}
		t.Logf("the phase ran from %s to %s, across a window boundary: again with a fresh descriptor",
			start.Format(time.TimeOnly), end.Format(time.TimeOnly))
	}
	t.Fatalf("%d phases in a row straddled a window boundary", WindowTries)
	var zero T
	return zero
}

// Budgets reads the per-minute budgets of a service config in the shape the fleet tests
// use: domain Domain, and descriptors budget=VALUE > tenant, each with a rate limit per
// minute; it returns requests_per_unit by VALUE.
func Budgets(t testing.TB, conf []byte) map[string]int {
	t.Helper()
	var c struct {
		Domain      string `yaml:"domain"`
		Descriptors []struct {
			Key         string `yaml:"key"`
			Value       string `yaml:"value"`
			Descriptors []struct {
				Key       string `yaml:"key"`
				RateLimit struct {
					Unit            string `yaml:"unit"`
					RequestsPerUnit int    `yaml:"requests_per_unit"`
				} `yaml:"rate_limit"`
			} `yaml:"descriptors"`
		} `yaml:"descriptors"`
	}
	if err := yaml.Unmarshal(conf, &c); err != nil {
		t.Fatalf("rate limit service config: %v", err)
	}
	if c.Domain != Domain {
		t.Fatalf("rate limit service config: domain %q, want %q", c.Domain, Domain)
	}
	got := map[string]int{}
	for _, d := range c.Descriptors {
		if d.Key != "budget" || len(d.Descriptors) != 1 || d.Descriptors[0].Key != "tenant" ||
			d.Descriptors[0].RateLimit.Unit != "minute" || d.Descriptors[0].RateLimit.RequestsPerUnit <= 0 {
			t.Fatalf("rate limit service config: want budget=VALUE > tenant, a positive limit per minute; got %+v", d)
		}
		got[d.Value] = d.Descriptors[0].RateLimit.RequestsPerUnit
	}
	return got
}
