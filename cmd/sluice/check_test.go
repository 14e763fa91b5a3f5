package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestCheck: `sluice check` loads files as `sluice serve --config` does and reports every
// problem of each, one per line with file:line, on stderr (exit 1), or one ok line per file
// on stdout (exit 0); a wrong command line exits 2.
func TestCheck(t *testing.T) {
	t.Setenv("SLUICE_CHECK_TEST_UNSET", "")
	const (
		good    = "testdata/check-good.yaml"
		bad     = "testdata/check-bad.yaml"
		policy  = "testdata/check-policy.yaml"
		replica = "testdata/check-replica.yaml"
	)
	badLines := []string{
		`testdata/check-bad.yaml:2:16: drain_timeout: invalid duration "soon" (use e.g. "1s", "250ms")`,
		`testdata/check-bad.yaml:6:9: clusters[0].endpoints[0].urll: unknown key (did you mean "url"?)`,
		`testdata/check-bad.yaml:9: routes[0].cluster: unknown cluster "nope"`,
		`testdata/check-bad.yaml:10:5: routes[0].timeout: unknown key (did you mean "timeouts"?)`,
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string // lines expected on stdout, exactly
		stderr []string // lines expected on stderr, in this order (other lines may come between)
	}{
		{"good file", []string{"check", "--config", good}, 0,
			[]string{good + ": ok (3 routes, 2 clusters, 1 tenant)"}, nil},
		{"good file as an argument", []string{"check", good}, 0,
			[]string{good + ": ok (3 routes, 2 clusters, 1 tenant)"}, nil},
		{"every problem at once", []string{"check", "--config", bad}, 1, nil,
			append(badLines, "sluice check: testdata/check-bad.yaml: 4 problems")},
		{"several files", []string{"check", "--config", good, bad, "--config", "testdata/missing.yaml"}, 1,
			[]string{good + ": ok (3 routes, 2 clusters, 1 tenant)"},
			append(badLines, "testdata/missing.yaml: read config: open testdata/missing.yaml: no such file or directory",
				"sluice check: 2 of 3 files have problems (5 problems)")},
		{"policies are built as the gateway builds them", []string{"check", policy}, 1, nil,
			[]string{`testdata/check-policy.yaml:8: routes[0].policies[0] (guard): params: json: unknown field "max_mesages"`}},
		{"a replica's environment is checked here", []string{"check", replica}, 1, nil,
			[]string{`testdata/check-replica.yaml:3: clusters[0].api_key_env: environment variable SLUICE_CHECK_TEST_UNSET is empty or unset`}},
		{"for replicas, it is theirs", []string{"check", "--for-replicas", "--config", replica}, 0,
			[]string{replica + ": ok for replicas (1 route, 1 cluster, 0 tenants)"}, nil},
		{"flags after the files", []string{"check", replica, "--for-replicas"}, 0,
			[]string{replica + ": ok for replicas (1 route, 1 cluster, 0 tenants)"}, nil},
		{"for replicas, the file's own problems stay", []string{"check", "--for-replicas", bad}, 1, nil, badLines},
		{"no file", []string{"check"}, 2, nil, []string{"usage: sluice check", "sluice check: --config FILE is required"}},
		{"unknown flag", []string{"check", "--confg", good}, 2, nil, []string{"sluice check: flag provided but not defined: -confg"}},
		{"help", []string{"check", "--help"}, 0, nil, []string{"usage: sluice check", "--for-replicas"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tt.args, &out, &errb)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errb.String())
			}
			if got := lines(out.String()); strings.Join(got, "\n") != strings.Join(tt.stdout, "\n") {
				t.Errorf("stdout:\n%s\nwant:\n%s", out.String(), strings.Join(tt.stdout, "\n"))
			}
			rest := errb.String()
			for _, w := range tt.stderr {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Errorf("stderr lacks %q (in this order):\n%s", w, errb.String())
					break
				}
				rest = rest[i+len(w):]
			}
			if tt.code == 0 && tt.stderr == nil && errb.Len() > 0 {
				t.Errorf("stderr of a good check: %s", errb.String())
			}
		})
	}
}

func lines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// TestCheckIsListed: the command table and usage name check.
func TestCheckIsListed(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--help"}, &out, &out); code != 0 || !strings.Contains(out.String(), "\n  check    ") {
		t.Errorf("usage (exit %d) does not list check:\n%s", code, out.String())
	}
}
