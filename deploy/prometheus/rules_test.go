// Package prometheus tests the Prometheus files Sluice ships: the alert and recording rules
// (deploy/chart/sluice/files/prometheus/alerts.yaml) with their promtool unit tests
// (alerts_test.yaml), the scrape config (scrape.yaml) and the prometheus-adapter rules
// (adapter.yaml). It holds tests only.
//
// The promtool checks need promtool on PATH (Debian's prometheus package); without it they
// skip, unless SLUICE_REQUIRE_TOOLS=1, which makes a missing promtool a failure (CI sets it).
// The other checks (rule structure, runbook links, test coverage of every alert, relabelling,
// adapter queries) run everywhere.
package prometheus

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

const (
	rulesPath     = "../chart/sluice/files/prometheus/alerts.yaml"
	unitTestsPath = "alerts_test.yaml"
	docPath       = "../observability.md"
	runbookBase   = "https://github.com/sluicegw/sluice/blob/main/deploy/observability.md#"
)

// ruleFile is Prometheus's rule-file format.
type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval"`
	Rules    []rule `yaml:"rules"`
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// unitTestFile is promtool's unit-test format (the parts these tests read).
type unitTestFile struct {
	RuleFiles          []string   `yaml:"rule_files"`
	EvaluationInterval string     `yaml:"evaluation_interval"`
	Tests              []unitTest `yaml:"tests"`
}

type unitTest struct {
	Interval    string `yaml:"interval"`
	InputSeries []struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	} `yaml:"input_series"`
	AlertRuleTest []struct {
		EvalTime  string `yaml:"eval_time"`
		Alertname string `yaml:"alertname"`
		ExpAlerts []struct {
			ExpLabels      map[string]string `yaml:"exp_labels"`
			ExpAnnotations map[string]string `yaml:"exp_annotations"`
		} `yaml:"exp_alerts"`
	} `yaml:"alert_rule_test"`
	PromqlExprTest []struct {
		Expr       string `yaml:"expr"`
		EvalTime   string `yaml:"eval_time"`
		ExpSamples []struct {
			Labels string  `yaml:"labels"`
			Value  float64 `yaml:"value"`
		} `yaml:"exp_samples"`
	} `yaml:"promql_expr_test"`
}

// decodeStrict decodes one YAML document into v; a field v does not have is an error.
func decodeStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding YAML: %w", err)
	}
	return nil
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := decodeStrict(data, &rf); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	if len(rf.Groups) == 0 {
		t.Fatalf("%s: no rule groups", rulesPath)
	}
	return rf
}

var (
	severities   = []string{"critical", "warning", "info"}
	recordName   = regexp.MustCompile(`^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$`)
	templateVars = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
)

// TestRuleFile checks what promtool does not: every alert has a severity the routing knows,
// a summary, a description and a runbook link to its section of deploy/observability.md;
// recording rules follow the level:metric:operations naming; names are unique; every
// expression parses; an annotation only names labels its alert's expression can carry.
func TestRuleFile(t *testing.T) {
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	problems, err := checkRuleFile(data, doc)
	if err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestRuleFileRejects shows that checkRuleFile finds each mistake it is for.
func TestRuleFileRejects(t *testing.T) {
	doc := []byte("### SluiceGood\n")
	good := `groups:
  - name: g
    rules:
      - record: sluice:good:rate5m
        expr: sum by (route) (rate(sluice_requests_total[5m]))
      - alert: SluiceGood
        expr: max by (route) (sluice_guard_level) > 0
        labels: {severity: warning}
        annotations:
          summary: "Route {{ $labels.route }}"
          description: "d"
          runbook_url: "https://github.com/sluicegw/sluice/blob/main/deploy/observability.md#sluicegood"
`
	if problems, err := checkRuleFile([]byte(good), doc); err != nil || len(problems) > 0 {
		t.Fatalf("the good file: %v %v", err, problems)
	}
	for _, tc := range []struct{ name, old, new, want string }{
		{"unknown severity", "severity: warning", "severity: urgent", "severity"},
		{"no description", `description: "d"`, `description: ""`, "no description"},
		{"runbook elsewhere", "#sluicegood", "#other", "runbook_url"},
		{"no runbook section", "alert: SluiceGood", "alert: SluiceUndocumented", "has no section"},
		{"label the expression drops", "$labels.route", "$labels.cluster", "$labels.cluster"},
		{"recording rule name", "sluice:good:rate5m", "sluice_good_rate5m", "level:metric:operations"},
		{"expression that does not parse", "(sluice_guard_level)", "(sluice_guard_level", "expr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(good, tc.old, tc.new, 1)
			if bad == good {
				t.Fatal("the case changes nothing")
			}
			problems, err := checkRuleFile([]byte(bad), doc)
			if err != nil {
				problems = append(problems, err.Error())
			}
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("%q not reported; got %q", tc.want, problems)
			}
		})
	}
}

// checkRuleFile returns the problems of a rule file; doc is the runbook page.
func checkRuleFile(data, doc []byte) ([]string, error) {
	var rf ruleFile
	if err := decodeStrict(data, &rf); err != nil {
		return nil, err
	}
	if len(rf.Groups) == 0 {
		return nil, errors.New("no rule groups")
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	headings := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			headings[strings.TrimSpace(h)] = true
		}
	}
	seen := map[string]bool{}
	groups := map[string]bool{}
	for _, g := range rf.Groups {
		if g.Name == "" || groups[g.Name] {
			bad("group name %q empty or repeated", g.Name)
		}
		groups[g.Name] = true
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			if (r.Alert == "") == (r.Record == "") {
				bad("group %s: a rule needs exactly one of alert and record (%q)", g.Name, name)
				continue
			}
			if seen[name] {
				bad("%s: defined twice", name)
			}
			seen[name] = true
			expr, err := parser.ParseExpr(r.Expr)
			if err != nil {
				bad("%s: expr: %v", name, err)
				continue
			}
			if r.Record != "" {
				if !recordName.MatchString(r.Record) {
					bad("recording rule %s: want level:metric:operations", r.Record)
				}
				continue
			}
			if !slices.Contains(severities, r.Labels["severity"]) {
				bad("%s: severity %q, want one of %v", name, r.Labels["severity"], severities)
			}
			for _, k := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[k]) == "" {
					bad("%s: no %s annotation", name, k)
				}
			}
			if want := runbookBase + strings.ToLower(name); r.Annotations["runbook_url"] != want {
				bad("%s: runbook_url %q, want %q", name, r.Annotations["runbook_url"], want)
			}
			if !headings[name] {
				bad("%s: %s has no section \"### %s\" (its runbook)", name, docPath, name)
			}
			kept := outputLabels(expr)
			for _, a := range r.Annotations {
				for _, m := range templateVars.FindAllStringSubmatch(a, -1) {
					if kept != nil && !kept[m[1]] {
						bad("%s: an annotation uses $labels.%s, which the expression drops (keeps %v)", name, m[1], keys(kept))
					}
				}
			}
		}
	}
	return problems, nil
}

// outputLabels returns the labels an expression's result keeps when its outermost
// aggregation says so (sum by (...), max by (...)), or nil when it cannot tell (a selector
// keeps every label of its series).
func outputLabels(e parser.Expr) map[string]bool {
	switch n := e.(type) {
	case *parser.ParenExpr:
		return outputLabels(n.Expr)
	case *parser.BinaryExpr:
		l := outputLabels(n.LHS)
		if n.Op == parser.LOR {
			r := outputLabels(n.RHS)
			if l == nil || r == nil {
				return nil
			}
			for k := range r {
				l[k] = true
			}
		}
		if l == nil && n.VectorMatching != nil && n.VectorMatching.Card == parser.CardOneToOne && !n.ReturnBool {
			return outputLabels(n.RHS)
		}
		return l
	case *parser.AggregateExpr:
		if n.Without || len(n.Grouping) == 0 {
			if len(n.Grouping) == 0 && !n.Without {
				return map[string]bool{}
			}
			return nil
		}
		out := map[string]bool{}
		for _, g := range n.Grouping {
			out[g] = true
		}
		return out
	case *parser.Call:
		if n.Func.Name == "histogram_quantile" && len(n.Args) == 2 {
			l := outputLabels(n.Args[1])
			delete(l, "le")
			return l
		}
		if n.Func.Name == "absent" {
			return nil
		}
	}
	return nil
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestUnitTestsCoverEveryAlert checks alerts_test.yaml: it loads alerts.yaml, and each alert
// has an evaluation where it fires and one where it must not (an empty exp_alerts; the
// firing ones list every alert expected, so their other series must not fire either). An
// alert without both is untested, whatever promtool says.
func TestUnitTestsCoverEveryAlert(t *testing.T) {
	rf := loadRules(t)
	data, err := os.ReadFile(unitTestsPath)
	if err != nil {
		t.Fatal(err)
	}
	var ut unitTestFile
	if err := decodeStrict(data, &ut); err != nil {
		t.Fatalf("%s: %v", unitTestsPath, err)
	}
	if len(ut.RuleFiles) != 1 || filepath.Clean(ut.RuleFiles[0]) != filepath.Clean(rulesPath) {
		t.Errorf("rule_files = %v, want [%s]", ut.RuleFiles, rulesPath)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, tc := range ut.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
			for _, e := range a.ExpAlerts {
				if len(e.ExpAnnotations) == 0 {
					t.Errorf("%s at %s: an expected alert without its annotations", a.Alertname, a.EvalTime)
				}
			}
		}
	}
	alerts := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			if fires[r.Alert] == 0 {
				t.Errorf("%s: no test case where it fires", r.Alert)
			}
			if quiet[r.Alert] == 0 {
				t.Errorf("%s: no test case where it must not fire", r.Alert)
			}
		}
	}
	for name := range fires {
		if !alerts[name] {
			t.Errorf("%s: tested but not defined", name)
		}
	}
	for name := range quiet {
		if !alerts[name] {
			t.Errorf("%s: tested but not defined", name)
		}
	}
}

// errNoTool marks a missing external tool.
var errNoTool = errors.New("not on PATH")
