package prometheus

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// promtool returns the path of promtool, or skips the test without it (fails instead when
// SLUICE_REQUIRE_TOOLS=1).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		msg := fmt.Sprintf("promtool %v (install Debian's prometheus package)", errNoTool)
		if os.Getenv("SLUICE_REQUIRE_TOOLS") == "1" {
			t.Fatalf("%s; SLUICE_REQUIRE_TOOLS=1 makes this a failure", msg)
		}
		t.Skipf("%s; set SLUICE_REQUIRE_TOOLS=1 to fail instead of skipping", msg)
	}
	return p
}

// runPromtool runs promtool with args (60s at most) and returns its combined output.
func runPromtool(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("promtool %s: %w", strings.Join(args, " "), ctx.Err())
	}
	if err != nil {
		return string(out), fmt.Errorf("promtool %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// TestPromtool runs promtool on the shipped files: check rules on the rules, test rules on
// their unit tests (about 6 seconds), and check config on the scrape config (see
// scrapeForPromtool for what is swapped first).
func TestPromtool(t *testing.T) {
	bin := promtool(t)
	scrape := scrapeForPromtool(t, "scrape.yaml")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"check rules", []string{"check", "rules", rulesPath}},
		{"test rules", []string{"test", "rules", unitTestsPath}},
		{"check config", []string{"check", "config", scrape}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runPromtool(t, bin, tc.args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !strings.Contains(out, "SUCCESS") {
				t.Fatalf("promtool %s printed no SUCCESS:\n%s", strings.Join(tc.args, " "), out)
			}
		})
	}
}

// TestPromtoolRejects shows that the checks above can fail: promtool must reject each broken
// file of testdata/ with the error named.
func TestPromtoolRejects(t *testing.T) {
	bin := promtool(t)
	for _, tc := range []struct {
		name    string
		args    func(t *testing.T) []string
		wantErr string
	}{
		{"rule with a PromQL syntax error", func(*testing.T) []string {
			return []string{"check", "rules", "testdata/broken_rules.yaml"}
		}, "parse error"},
		{"alert with a bad template", func(*testing.T) []string {
			return []string{"check", "rules", "testdata/broken_template.yaml"}
		}, "template"},
		{"unit test expecting an alert that does not fire", func(*testing.T) []string {
			return []string{"test", "rules", "testdata/wrong_expectation_test.yaml"}
		}, "SluiceXdsDisconnected"},
		{"unit test expecting wrong annotations", func(*testing.T) []string {
			return []string{"test", "rules", "testdata/wrong_annotation_test.yaml"}
		}, "SluiceRouteBreakerOpen"},
		{"scrape config with an invalid relabel regex", func(t *testing.T) []string {
			return []string{"check", "config", scrapeForPromtool(t, "testdata/broken_scrape.yaml")}
		}, "error parsing regexp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runPromtool(t, bin, tc.args(t)...)
			if err == nil {
				t.Fatalf("promtool accepted it:\n%s", out)
			}
			if !strings.Contains(out, tc.wantErr) {
				t.Fatalf("promtool failed without %q:\n%s", tc.wantErr, out)
			}
		})
	}
}

// scrapeForPromtool writes a copy of the scrape config that promtool check config can load
// into a temporary directory and returns its path: the files it names under /etc/prometheus/
// (the rules, the metrics token) are created there, the rules being the shipped ones; and,
// because Debian's promtool is built without Kubernetes service discovery,
// kubernetes_sd_configs becomes file_sd_configs (TestScrapeRelabel checks the Kubernetes
// part against Prometheus's own relabelling code).
func scrapeForPromtool(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rules, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{
		"rules/sluice-alerts.yaml":            rules,
		"secrets/sluice-tokens/metrics-token": []byte("metrics-token\n"),
		"targets.json":                        []byte("[]\n"),
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := strings.ReplaceAll(string(data), "/etc/prometheus/", dir+"/")
	if strings.Contains(s, "kubernetes_sd_configs:") {
		s = swapKubernetesSD(t, s, filepath.Join(dir, "targets.json"))
	}
	out := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(out, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// swapKubernetesSD replaces the kubernetes_sd_configs block of a scrape config (the key and
// the lines indented under it) with a file_sd_configs block reading targets.
func swapKubernetesSD(t *testing.T, s, targets string) string {
	t.Helper()
	lines := strings.Split(s, "\n")
	var out []string
	swapped := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		trimmed := strings.TrimLeft(l, " ")
		if trimmed != "kubernetes_sd_configs:" {
			out = append(out, l)
			continue
		}
		indent := len(l) - len(trimmed)
		out = append(out, strings.Repeat(" ", indent)+"file_sd_configs:",
			strings.Repeat(" ", indent+2)+"- files: ["+targets+"]")
		for i+1 < len(lines) {
			next := lines[i+1]
			nt := strings.TrimLeft(next, " ")
			if nt != "" && len(next)-len(nt) <= indent {
				break
			}
			i++
		}
		swapped = true
	}
	if !swapped {
		t.Fatal("no kubernetes_sd_configs line to swap")
	}
	return strings.Join(out, "\n")
}
