package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCommands(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string // substring expected on stdout
		stderr string // substring expected on stderr
	}{
		{"no command", nil, 2, "usage: sluice <command>", ""},
		{"help", []string{"--help"}, 0, "commands:", ""},
		{"unknown", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"version", []string{"version"}, 0, "sluice " + version, ""},
		{"serve help", []string{"serve", "--help"}, 0, "", "--upstream"},
		{"serve needs a source", []string{"serve"}, 1, "", "--config or --upstream is required"},
		{"serve both sources", []string{"serve", "--config", "x.yaml", "--upstream", "http://127.0.0.1:1"}, 1, "", "either --config or --upstream"},
		{"serve bad upstream", []string{"serve", "--upstream", "127.0.0.1:8000"}, 1, "", "give a URL with its scheme, e.g. http://127.0.0.1:8000"},
		{"serve bad config", []string{"serve", "--config", "testdata/bad.yaml"}, 1, "", "routes[0].cluster: unknown cluster"},
		{"mock help", []string{"mock", "--help"}, 0, "", "--max-running"},
		{"mock bad flags", []string{"mock", "--max-running", "-3"}, 1, "", "MaxRunning: must be >= 0"},
		{"demo help", []string{"demo", "--help"}, 0, "", "--requests"},
		{"gpu help", []string{"gpu", "--help"}, 0, "", "--json"},
		{"xds help", []string{"xds", "--help"}, 0, "", "--route-config"},
		{"xds needs a config", []string{"xds"}, 1, "", "--config is required"},
		{"xds bad config", []string{"xds", "--config", "testdata/bad.yaml", "--listen", "127.0.0.1:0"}, 1, "", "routes[0].cluster: unknown cluster"},
		{"xds help names the progression flags", []string{"xds", "--help"}, 0, "", "--shadow-store"},
		{"xds shadow store not shared", []string{"xds", "--config", "testdata/check-good.yaml", "--shadow-store", "/var/lib/sluice/shadow.db"}, 1, "", "--shadow-store \"/var/lib/sluice/shadow.db\": a postgres:// URL"},
		{"xds shadow store bad URL", []string{"xds", "--config", "testdata/check-good.yaml", "--shadow-store", "postgres://db/shadow?sslmode=sometimes"}, 1, "", "--shadow-store: "},
		{"xds admin address invalid", []string{"xds", "--config", "testdata/check-good.yaml", "--listen", "127.0.0.1:0", "--admin", "256.0.0.1:1"}, 1, "", "admin listen 256.0.0.1:1"},
		{"load help", []string{"load", "--help"}, 0, "", "--target"},
		{"load needs a target", []string{"load", "--synthetic", "in=fixed:10,out=fixed:4"}, 1, "", "target: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tt.args, &out, &errb)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errb.String())
			}
			if !strings.Contains(out.String(), tt.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdout, out.String())
			}
			if !strings.Contains(errb.String(), tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, errb.String())
			}
		})
	}
}

// TestDemo runs the README's first command, shortened: every request through the gateway
// succeeds and both routes report; the output side cuts every looping stream and no
// ordinary one, and flags the planted KV-cache leak.
func TestDemo(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"demo", "--requests", "8", "--concurrency", "4", "--max-tokens", "8", "--shadow-requests", "48"}, &out, &errb); code != 0 {
		t.Fatalf("demo exit %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
	}
	for _, want := range []string{"chat-llama", "chat-small", "8 requests in", "shadow phase", "rollback",
		"runaway: 8 of 8 looping streams cut", "0 of 8 ordinary answers cut", "state: kv_leak flagged", "state: stall flagged", "confidence: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "error:") {
		t.Errorf("demo had errors:\n%s", out.String())
	}
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasPrefix(f[0], "chat-") && f[2] != "0" {
			t.Errorf("route %s had %s errors", f[0], f[2])
		}
	}
}
