package prometheus

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

// adapterConfig is prometheus-adapter's config file (pkg/config in the adapter): the parts
// a custom-metrics rule may hold, so that a misspelt field is an error here as it is there.
type adapterConfig struct {
	Rules         []adapterRule `yaml:"rules"`
	ExternalRules []adapterRule `yaml:"externalRules"`
}

type adapterRule struct {
	SeriesQuery   string `yaml:"seriesQuery"`
	SeriesFilters []struct {
		Is    string `yaml:"is"`
		IsNot string `yaml:"isNot"`
	} `yaml:"seriesFilters"`
	Resources struct {
		Template  string `yaml:"template"`
		Overrides map[string]struct {
			Group    string `yaml:"group"`
			Resource string `yaml:"resource"`
		} `yaml:"overrides"`
		Namespaced *bool `yaml:"namespaced"`
	} `yaml:"resources"`
	Name struct {
		Matches string `yaml:"matches"`
		As      string `yaml:"as"`
	} `yaml:"name"`
	MetricsQuery string `yaml:"metricsQuery"`
}

// servedMetric is what one adapter rule serves: the custom metric's name, the series it
// comes from, and the PromQL the adapter runs for a Pods request.
type servedMetric struct {
	name, series, query string
}

// adapterMetrics checks the rules of an adapter config the way the adapter applies them and
// returns what each serves: the series query is a selector with a metric name that
// name.matches matches, the resources map namespace and pod (a Pods metric), and the
// metrics query, its templates filled in as the adapter fills them, is PromQL.
func adapterMetrics(data []byte) ([]servedMetric, error) {
	var ac adapterConfig
	if err := decodeStrict(data, &ac); err != nil {
		return nil, err
	}
	if len(ac.Rules) == 0 {
		return nil, errors.New("no rules")
	}
	var out []servedMetric
	var errs []error
	for i, r := range ac.Rules {
		sm, err := adapterRuleMetric(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("rules[%d]: %w", i, err))
			continue
		}
		out = append(out, sm)
	}
	return out, errors.Join(errs...)
}

func adapterRuleMetric(r adapterRule) (servedMetric, error) {
	ms, err := parser.ParseMetricSelector(r.SeriesQuery)
	if err != nil {
		return servedMetric{}, fmt.Errorf("seriesQuery %q: %w", r.SeriesQuery, err)
	}
	series := ""
	have := map[string]bool{}
	for _, m := range ms {
		have[m.Name] = true
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			series = m.Value
		}
	}
	if series == "" {
		return servedMetric{}, fmt.Errorf("seriesQuery %q names no metric", r.SeriesQuery)
	}
	for label, res := range map[string]string{"namespace": "namespace", "pod": "pod"} {
		if r.Resources.Overrides[label].Resource != res {
			return servedMetric{}, fmt.Errorf("resources.overrides.%s: want {resource: %s} (a Pods metric)", label, res)
		}
		if !have[label] {
			return servedMetric{}, fmt.Errorf("seriesQuery %q: select series with a %s label (%s!=\"\")", r.SeriesQuery, label, label)
		}
	}
	re, err := regexp.Compile(r.Name.Matches)
	if err != nil {
		return servedMetric{}, fmt.Errorf("name.matches: %w", err)
	}
	if !re.MatchString(series) {
		return servedMetric{}, fmt.Errorf("name.matches %q does not match the series %s", r.Name.Matches, series)
	}
	name := series
	if r.Name.As != "" {
		name = re.ReplaceAllString(series, r.Name.As)
	}
	tmpl, err := template.New("metricsQuery").Delims("<<", ">>").Option("missingkey=error").Parse(r.MetricsQuery)
	if err != nil {
		return servedMetric{}, fmt.Errorf("metricsQuery: %w", err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, map[string]any{
		"Series": series, "LabelMatchers": `namespace="inference",pod=~"sluice-a|sluice-b"`,
		"GroupBy": "pod", "GroupBySlice": []string{"pod"},
	}); err != nil {
		return servedMetric{}, fmt.Errorf("metricsQuery: %w", err)
	}
	e, err := parser.ParseExpr(b.String())
	if err != nil {
		return servedMetric{}, fmt.Errorf("metricsQuery %q: %w", b.String(), err)
	}
	if e.Type() != parser.ValueTypeVector {
		return servedMetric{}, fmt.Errorf("metricsQuery gives a %s, want an instant vector", e.Type())
	}
	// The adapter matches the result to pods by the pod label: the query must keep it.
	if agg, ok := outermostAggregation(e); ok && !agg.Without && !containsString(agg.Grouping, "pod") {
		return servedMetric{}, fmt.Errorf("metricsQuery %q drops the pod label", b.String())
	}
	return servedMetric{name: name, series: series, query: b.String()}, nil
}

func outermostAggregation(e parser.Expr) (*parser.AggregateExpr, bool) {
	switch n := e.(type) {
	case *parser.ParenExpr:
		return outermostAggregation(n.Expr)
	case *parser.BinaryExpr:
		return outermostAggregation(n.LHS)
	case *parser.AggregateExpr:
		return n, true
	}
	return nil, false
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TestAdapterRules checks adapter.yaml and that it serves every Pods metric an HPA of the
// rendered manifests (deploy/rendered/*.yaml) scales on.
func TestAdapterRules(t *testing.T) {
	data, err := os.ReadFile("adapter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	served, err := adapterMetrics(data)
	if err != nil {
		t.Fatalf("adapter.yaml: %v", err)
	}
	names := map[string]bool{}
	for _, s := range served {
		names[s.name] = true
	}
	for _, want := range []string{"sluice_requests_in_flight", "sluice_concurrency_saturation"} {
		if !names[want] {
			t.Errorf("adapter.yaml does not serve %s (serves %v)", want, served)
		}
	}
	files, err := filepath.Glob("../rendered/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	hpas := 0
	for _, f := range files {
		for _, m := range hpaPodsMetrics(t, f) {
			hpas++
			if !names[m] {
				t.Errorf("%s: a HorizontalPodAutoscaler scales on the Pods metric %s, which adapter.yaml does not serve", f, m)
			}
		}
	}
	t.Logf("%d Pods metrics of rendered HPAs checked", hpas)
}

// hpaPodsMetrics returns the Pods metric names the HorizontalPodAutoscalers of a rendered
// multi-document file scale on.
func hpaPodsMetrics(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Metrics []struct {
					Type string `yaml:"type"`
					Pods struct {
						Metric struct {
							Name string `yaml:"name"`
						} `yaml:"metric"`
					} `yaml:"pods"`
				} `yaml:"metrics"`
			} `yaml:"spec"`
		}
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if doc.Kind != "HorizontalPodAutoscaler" {
			continue
		}
		for _, m := range doc.Spec.Metrics {
			if m.Type == "Pods" {
				out = append(out, m.Pods.Metric.Name)
			}
		}
	}
	return out
}

// TestAdapterRulesReject shows that adapterMetrics fails on the mistakes that leave an HPA
// without its metric.
func TestAdapterRulesReject(t *testing.T) {
	good := `rules:
  - seriesQuery: 'sluice_requests_in_flight{namespace!="",pod!=""}'
    resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
    name: {matches: "^sluice_requests_in_flight$", as: "sluice_requests_in_flight"}
    metricsQuery: 'sum by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})'
`
	if _, err := adapterMetrics([]byte(good)); err != nil {
		t.Fatalf("the good rule: %v", err)
	}
	for _, tc := range []struct{ name, old, new, want string }{
		{"misspelt field", "metricsQuery:", "metricQuery:", "field metricQuery not found"},
		{"name regex that misses the series", `"^sluice_requests_in_flight$"`, `"^sluice_in_flight$"`, "does not match the series"},
		{"no pod resource", "pod: {resource: pod}", "pod: {resource: pods}", "resources.overrides.pod"},
		{"series without a pod label", `,pod!=""`, "", `select series with a pod label`},
		{"metrics query that does not parse", "(<<.Series>>{<<.LabelMatchers>>})", "(<<.Series>>{<<.LabelMatchers>>}", "metricsQuery"},
		{"metrics query that drops the pod", "sum by (<<.GroupBy>>)", "sum by (namespace)", "drops the pod label"},
		{"unknown template field", "<<.GroupBy>>", "<<.Groups>>", "metricsQuery"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(good, tc.old, tc.new, 1)
			if bad == good {
				t.Fatalf("the case changes nothing")
			}
			_, err := adapterMetrics([]byte(bad))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}
