package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"github.com/sluicegw/sluice/proxy/telemetry"
	"github.com/sluicegw/sluice/test/sim"
	xdsserver "github.com/sluicegw/sluice/xds/server"
)

// The observability files Sluice ships (deploy/observability.md).
const (
	obsRulesFile    = "../../deploy/chart/sluice/files/prometheus/alerts.yaml"
	obsAdapterFile  = "../../deploy/prometheus/adapter.yaml"
	obsDashboardDir = "../../deploy/chart/sluice/files/grafana"
)

// targetLabels are the labels Prometheus adds to every series of a target (the scrape config
// and the ServiceMonitor set them): a query may match on them although /metrics has none.
var targetLabels = []string{"namespace", "job", "pod", "instance", "container", "release", "node", "service", "endpoint_name"}

// promQuery is one PromQL expression a shipped file runs, and where it is.
type promQuery struct {
	where string
	expr  string
}

// grafanaVar matches a Grafana variable reference: $name, ${name} or ${name:format}.
var grafanaVar = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// grafanaExpand replaces Grafana's variables in a query with values PromQL parses: the
// interval ones with a duration, the others with a literal. "${1}", a regular expression's
// group in label_replace, is left alone, as Grafana leaves it.
func grafanaExpand(q string) string {
	return grafanaVar.ReplaceAllStringFunc(q, func(m string) string {
		name := strings.TrimPrefix(strings.TrimPrefix(m, "${"), "$")
		name, _, _ = strings.Cut(strings.TrimSuffix(name, "}"), ":")
		switch {
		case name[0] >= '0' && name[0] <= '9':
			return m
		case strings.HasPrefix(name, "__") && (strings.Contains(name, "interval") || strings.Contains(name, "range")):
			return "5m"
		}
		return "x"
	})
}

// ruleQueries returns every expression of a rule file and the names its recording rules
// define.
func ruleQueries(path string) ([]promQuery, map[string]bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var rf struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Record string `yaml:"record"`
				Alert  string `yaml:"alert"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &rf); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	var qs []promQuery
	recorded := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			qs = append(qs, promQuery{where: fmt.Sprintf("%s: %s%s", filepath.Base(path), r.Alert, r.Record), expr: r.Expr})
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	if len(qs) == 0 {
		return nil, nil, fmt.Errorf("%s: no rules", path)
	}
	return qs, recorded, nil
}

// adapterQueries returns the series and metrics queries of prometheus-adapter rules, with the
// adapter's templates filled in as it fills them for a Pods metric.
func adapterQueries(path string) ([]promQuery, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ac struct {
		Rules []struct {
			SeriesQuery  string `yaml:"seriesQuery"`
			MetricsQuery string `yaml:"metricsQuery"`
		} `yaml:"rules"`
	}
	if err := yaml.Unmarshal(data, &ac); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var qs []promQuery
	for i, r := range ac.Rules {
		where := fmt.Sprintf("%s: rules[%d]", filepath.Base(path), i)
		series, err := parser.ParseMetricSelector(r.SeriesQuery)
		if err != nil || len(series) == 0 {
			return nil, fmt.Errorf("%s: seriesQuery %q: %v", where, r.SeriesQuery, err)
		}
		name := ""
		for _, m := range series {
			if m.Name == labels.MetricName {
				name = m.Value
			}
		}
		tmpl, err := template.New(where).Delims("<<", ">>").Parse(r.MetricsQuery)
		if err != nil {
			return nil, fmt.Errorf("%s: metricsQuery: %w", where, err)
		}
		var b bytes.Buffer
		if err := tmpl.Execute(&b, map[string]any{
			"Series": name, "LabelMatchers": `namespace="inference",pod=~"sluice-a|sluice-b"`,
			"GroupBy": "pod", "GroupBySlice": []string{"pod"},
		}); err != nil {
			return nil, fmt.Errorf("%s: metricsQuery: %w", where, err)
		}
		qs = append(qs, promQuery{where: where + " seriesQuery", expr: r.SeriesQuery}, promQuery{where: where + " metricsQuery", expr: b.String()})
	}
	return qs, nil
}

// dashboard is the part of a Grafana dashboard these checks read.
type dashboard struct {
	UID           string           `json:"uid"`
	Title         string           `json:"title"`
	SchemaVersion int              `json:"schemaVersion"`
	Panels        []dashboardPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasourceRef  `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type dashboardPanel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource *datasourceRef           `json:"datasource"`
	GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"` // a collapsed row's
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// variableQuery is a query variable's PromQL: label_values(EXPR, label) or
// query_result(EXPR) give EXPR; label_values(label) and metrics(...) query no metric.
var (
	labelValuesQuery = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
	queryResultQuery = regexp.MustCompile(`^\s*query_result\((.*)\)\s*$`)
)

// checkDashboard parses one dashboard file, checks its structure (a title and uid, a
// current schema, a datasource variable, every panel with the Prometheus datasource of that
// variable and at least one target, panels that do not overlap, every variable used) and
// returns its queries with the problems found.
func checkDashboard(path string) ([]promQuery, []string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	base := filepath.Base(path)
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, base+": "+fmt.Sprintf(format, args...)) }
	if d.UID == "" || d.Title == "" {
		bad("no uid or title")
	}
	if d.SchemaVersion < 36 {
		bad("schemaVersion %d: want 36 or later (Grafana 9+)", d.SchemaVersion)
	}
	var qs []promQuery
	used := map[string]bool{}
	note := func(s string) {
		for _, m := range grafanaVar.FindAllStringSubmatch(s, -1) {
			used[m[1]+m[2]] = true
		}
	}
	dsVar := ""
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			dsVar = v.Name
		case "query":
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil {
				var obj struct {
					Query string `json:"query"`
				}
				if err := json.Unmarshal(v.Query, &obj); err != nil {
					bad("variable %s: query is neither a string nor {query}", v.Name)
					continue
				}
				q = obj.Query
			}
			note(q)
			if v.Datasource == nil || v.Datasource.UID != "${"+dsVar+"}" {
				bad("variable %s: datasource %v, want the datasource variable", v.Name, v.Datasource)
			}
			if m := labelValuesQuery.FindStringSubmatch(q); m != nil {
				qs = append(qs, promQuery{where: base + ": variable " + v.Name, expr: m[1]})
			} else if m := queryResultQuery.FindStringSubmatch(q); m != nil {
				qs = append(qs, promQuery{where: base + ": variable " + v.Name, expr: m[1]})
			}
		}
	}
	if dsVar == "" {
		bad("no datasource variable")
	}
	type rect struct {
		title      string
		x, y, w, h int
	}
	var rects []rect
	var walk func(ps []dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			rects = append(rects, rect{p.Title, p.GridPos.X, p.GridPos.Y, p.GridPos.W, p.GridPos.H})
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${"+dsVar+"}" {
				bad("panel %q: datasource %v, want {prometheus, ${%s}}", p.Title, p.Datasource, dsVar)
			}
			if p.Datasource != nil {
				note(p.Datasource.UID)
			}
			if len(p.Targets) == 0 {
				bad("panel %q: no target", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					bad("panel %q: target %s has no expr", p.Title, tg.RefID)
					continue
				}
				note(tg.Expr)
				qs = append(qs, promQuery{where: fmt.Sprintf("%s: panel %q %s", base, p.Title, tg.RefID), expr: tg.Expr})
			}
		}
	}
	walk(d.Panels)
	for i, a := range rects {
		if a.w <= 0 || a.h <= 0 || a.x < 0 || a.x+a.w > 24 {
			bad("panel %q: gridPos %+v outside the 24 columns", a.title, a)
		}
		for _, b := range rects[:i] {
			if a.x < b.x+b.w && b.x < a.x+a.w && a.y < b.y+b.h && b.y < a.y+a.h {
				bad("panels %q and %q overlap", b.title, a.title)
			}
		}
	}
	for _, v := range d.Templating.List {
		if !used[v.Name] {
			bad("variable %s is never used", v.Name)
		}
	}
	return qs, problems, nil
}

// selectorUse is one vector selector of a query.
type selectorUse struct {
	where    string
	name     string
	matchers []*labels.Matcher
}

// selectorsOf parses a query (Grafana's variables filled in) and returns its vector
// selectors.
func selectorsOf(q promQuery) ([]selectorUse, error) {
	e, err := parser.ParseExpr(grafanaExpand(q.expr))
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", q.where, err, q.expr)
	}
	var out []selectorUse
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		u := selectorUse{where: q.where, name: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName {
				if m.Type == labels.MatchEqual {
					u.name = m.Value
				}
				continue
			}
			u.matchers = append(u.matchers, m)
		}
		out = append(out, u)
		return nil
	})
	return out, nil
}

// exposedSeries is what a /metrics page holds: for each sample name (histograms as _bucket,
// _sum and _count), the label names its series carry and the values of each.
type exposedSeries map[string]map[string]map[string]bool

func (ex exposedSeries) add(name string, lbls map[string]string) {
	if ex[name] == nil {
		ex[name] = map[string]map[string]bool{}
	}
	for k, v := range lbls {
		if ex[name][k] == nil {
			ex[name][k] = map[string]bool{}
		}
		ex[name][k][v] = true
	}
}

// parseExposition reads a Prometheus text exposition into ex.
func parseExposition(ex exposedSeries, body []byte) error {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("parsing /metrics: %w", err)
	}
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			lbls := map[string]string{}
			for _, lp := range m.GetLabel() {
				lbls[lp.GetName()] = lp.GetValue()
			}
			switch {
			case m.GetHistogram() != nil:
				ex.add(name+"_sum", lbls)
				ex.add(name+"_count", lbls)
				for _, b := range m.GetHistogram().GetBucket() {
					bl := map[string]string{"le": strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)}
					for k, v := range lbls {
						bl[k] = v
					}
					ex.add(name+"_bucket", bl)
				}
				inf := map[string]string{"le": "+Inf"}
				for k, v := range lbls {
					inf[k] = v
				}
				ex.add(name+"_bucket", inf)
			case m.GetSummary() != nil:
				ex.add(name, lbls)
				ex.add(name+"_sum", lbls)
				ex.add(name+"_count", lbls)
			default:
				ex.add(name, lbls)
			}
		}
	}
	return nil
}

// missingFromExposition lists what the selectors query that the exposition lacks: a metric
// name that is neither exposed nor recorded by a rule nor exempt, a label a matcher names
// that none of the metric's series carries (target labels aside), and a bucket boundary (an
// le matcher) that no bucket of the histogram matches.
func missingFromExposition(uses []selectorUse, ex exposedSeries, recorded, exempt map[string]bool) []string {
	var out []string
	for _, u := range uses {
		if u.name == "" {
			out = append(out, fmt.Sprintf("%s: a selector without a metric name", u.where))
			continue
		}
		if recorded[u.name] || exempt[u.name] {
			continue
		}
		series, ok := ex[u.name]
		if !ok {
			out = append(out, fmt.Sprintf("%s: %s is not on /metrics", u.where, u.name))
			continue
		}
		for _, m := range u.matchers {
			if slices.Contains(targetLabels, m.Name) {
				continue
			}
			values, ok := series[m.Name]
			if !ok {
				if !m.Matches("") {
					out = append(out, fmt.Sprintf("%s: %s has no label %s (it has %v)", u.where, u.name, m.Name, labelNames(series)))
				}
				continue
			}
			if m.Name == "le" {
				hit := false
				for v := range values {
					hit = hit || m.Matches(v)
				}
				if !hit {
					out = append(out, fmt.Sprintf("%s: %s has no bucket %s (its boundaries: %v)", u.where, u.name, m, labelValues(values)))
				}
			}
		}
	}
	return out
}

func labelNames(series map[string]map[string]bool) []string {
	var out []string
	for k := range series {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func labelValues(values map[string]bool) []string {
	var out []string
	for v := range values {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// shippedQueries collects every query of the shipped rules, dashboards and adapter rules,
// with the recording rules' names; it fails the test on a dashboard problem.
func shippedQueries(t *testing.T) ([]selectorUse, map[string]bool) {
	t.Helper()
	qs, recorded, err := ruleQueries(obsRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	aq, err := adapterQueries(obsAdapterFile)
	if err != nil {
		t.Fatal(err)
	}
	qs = append(qs, aq...)
	files, err := filepath.Glob(filepath.Join(obsDashboardDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s (%v)", obsDashboardDir, err)
	}
	uids := map[string]string{}
	for _, f := range files {
		dq, problems, err := checkDashboard(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Error(p)
		}
		var d struct {
			UID string `json:"uid"`
		}
		data, _ := os.ReadFile(f)
		_ = json.Unmarshal(data, &d)
		if other, dup := uids[d.UID]; dup {
			t.Errorf("%s and %s share the uid %q", other, f, d.UID)
		}
		uids[d.UID] = f
		qs = append(qs, dq...)
	}
	var uses []selectorUse
	for _, q := range qs {
		u, err := selectorsOf(q)
		if err != nil {
			t.Error(err)
			continue
		}
		uses = append(uses, u...)
	}
	return uses, recorded
}

// observabilityConfig is a gateway on which every series the shipped files query appears:
//   - route chat (cluster main) with a rate limit, the guard and a concurrency limit, mirrored
//     to a candidate with a baseline (the shadow series and a verdict);
//   - route flaky (model "flaky") on cluster failing, whose endpoint answers 500 (upstream
//     errors), with a fallback to backup; route nobudget on the same cluster with a retry
//     budget of zero (a refused retry: the 500 stands);
//   - load signals from the simulators' /metrics (endpoint gauges and scrape failures);
//   - every route with its cluster breakers (sluice_route_breaker_state).
func observabilityConfig(main, failing, backup, base, cand string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
load_signals: {interval: 50ms, staleness: 10s}
shadow: {interval: 100ms, window: 50, verdict: {min_samples: 8}}
clusters:
  - name: main
    endpoints: [{url: %[1]s, metrics: %[1]s/metrics}]
  - name: failing
    endpoints: [{url: %[2]s, metrics: %[2]s/metrics}]
  - name: backup
    endpoints: [{url: %[3]s}]
  - name: base
    endpoints: [{url: %[4]s}]
  - name: cand
    endpoints: [{url: %[5]s}]
routes:
  - name: flaky
    match: {model: flaky}
    cluster: failing
    fallback: [{cluster: backup, model: sim-llama}]
    breaker: {min_requests: 2, failure_ratio: 0.5, open_for: 1m}
  - name: nobudget
    match: {model: nobudget}
    cluster: failing
    retry: {attempts: 2, budget: 0, min_retries_per_second: 0}
  - name: chat
    cluster: main
    policies:
      - {type: ratelimit, params: {requests_per_minute: 100000}}
      - {type: guard}
      - {type: concurrency, params: {max_limit: 64}}
    mirror: {cluster: cand, baseline: base, fraction: 1}
`, main, failing, backup, base, cand)
}

// TestObservabilityQueriesExist proves that every metric the shipped alert and recording
// rules, Grafana dashboards and prometheus-adapter rules query exists on a running gateway's
// /metrics, with the labels their matchers name and the histogram buckets their le matchers
// pick (the TTFT SLO threshold among them). The gateway is driven until each series exists:
// streamed chat through the policies and the mirror (TTFT, time per token, tokens, shadow
// verdict), a request whose primary fails and falls back (upstream errors), one whose retry
// the budget refuses,
// a config reload, load signals from the simulators; a second gateway takes its config from
// an xDS control plane (sluice_xds_*). Exempt: Prometheus's own up, and the sluice_gpu_*
// gauges on a host where NVML finds no GPU.
func TestObservabilityQueriesExist(t *testing.T) {
	uses, recorded := shippedQueries(t)

	mainSim := startSim(t, sim.Config{TTFT: 2 * time.Millisecond, ITL: time.Millisecond})
	backup := startSim(t, sim.Config{})
	base := startSim(t, sim.Config{})
	cand := startSim(t, sim.Config{})
	failing := startRecorder(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`))
	})
	cfgPath := filepath.Join(t.TempDir(), "sluice.yaml")
	cfg := observabilityConfig(mainSim.URL, failing.URL, backup.URL, base.URL, cand.URL)
	// The telemetry sluice serve builds: with the Go runtime and process collectors.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tel, err := telemetry.New(context.Background(), telemetry.Options{ServiceVersion: "e2e", Registry: reg})
	if err != nil {
		t.Fatalf("telemetry: %v", err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) }) // after the gateway's shutdown
	g := startGateway(t, cfg, gatewayOpts{configPath: cfgPath, watchInterval: 50 * time.Millisecond, telemetry: tel})
	hc := newHTTPClient(t)
	api := "http://" + g.addr + "/v1/chat/completions"

	for i := range 6 {
		body := fmt.Sprintf(`{"model":"sim-llama","stream":true,"stream_options":{"include_usage":true},"max_tokens":8,"messages":[{"role":"user","content":"observe %d"}]}`, i)
		if resp, b := do(t, hc, http.MethodPost, api, body); resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: %d %s", resp.StatusCode, b)
		}
	}
	if resp, b := do(t, hc, http.MethodPost, api, `{"model":"flaky","max_tokens":4,"messages":[{"role":"user","content":"fail over"}]}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("flaky: %d %s (want the fallback's answer)", resp.StatusCode, b)
	}
	if resp, b := do(t, hc, http.MethodPost, api, `{"model":"nobudget","max_tokens":4,"messages":[{"role":"user","content":"retry"}]}`); resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("nobudget: %d %s (want the 500 to stand, its retry refused)", resp.StatusCode, b)
	}
	// A reload (the same config, one comment more) for sluice_config_reloads_total.
	writeFileAtomic(t, cfgPath, cfg+"# reloaded\n")
	eventually(t, 10*time.Second, "the shadow pairs, a verdict, fresh load signals and a reload", func() bool {
		resp, _ := do(t, hc, http.MethodPost, "http://"+g.admin+"/admin/shadow/judge", "")
		return resp.StatusCode == http.StatusOK &&
			metricValue(t, hc, g.admin, "sluice_shadow_pairs_total", `route="chat"`) >= 1 &&
			metricValue(t, hc, g.admin, "sluice_shadow_verdict", `route="chat"`) == 1 &&
			hasMetric(t, hc, g.admin, "sluice_endpoint_requests_running") &&
			metricValue(t, hc, g.admin, "sluice_config_reloads_total", `result="ok"`) >= 1
	})
	if v := metricValue(t, hc, g.admin, "sluice_retry_budget_exhausted_total", `route="nobudget"`, `kind="retry"`); v < 1 {
		t.Errorf(`sluice_retry_budget_exhausted_total{route="nobudget",kind="retry"} = %v, want the refused retry`, v)
	}

	// A replica under xDS, for the sluice_xds_* series.
	xsim := startSim(t, sim.Config{})
	cp := startControlPlane(t, "127.0.0.1:0")
	xg := startXDSGateway(t, cp.addr, "replica-obs", true)
	cp.push(t, "1", resList(staticClusterOf(t, "a", xsim.URL), weightedRoute(nil, "a", 100)), "replica-obs")
	eventually(t, 10*time.Second, "the xDS replica ready", func() bool { return readyz(t, hc, xg.admin) == http.StatusOK })

	// The control plane (xds/server, what `sluice xds` runs) with a shadow store and a route
	// with a progression, for its sluice_xds_* and store series (the alerts on the
	// progression's leader and the fleet reads). A store file serves one host as a shared
	// one would.
	dir := t.TempDir()
	cpFile := filepath.Join(dir, "fleet.yaml")
	writeFileAtomic(t, cpFile, fleetFile(mainSim.URL, base.URL, cand.URL, backup.URL, "good", 10, nil))
	cps, err := xdsserver.New(xdsserver.Options{ConfigPath: cpFile, ShadowStore: filepath.Join(dir, "shadow.db"), WatchInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cpCtx, cpStop := context.WithCancel(context.Background())
	cpDone := make(chan error, 1)
	go func() { cpDone <- cps.Serve(cpCtx, cpLn) }()
	t.Cleanup(func() {
		cpStop()
		select {
		case <-cpDone:
		case <-time.After(10 * time.Second):
			t.Error("the control plane did not stop within 10s")
		}
	})
	cpAdmin := httptest.NewServer(cps.AdminHandler("127.0.0.1:0"))
	t.Cleanup(cpAdmin.Close)
	cpAddr := strings.TrimPrefix(cpAdmin.URL, "http://")
	eventually(t, 10*time.Second, "the control plane leads its progression", func() bool {
		return metricValue(t, hc, cpAddr, "sluice_xds_progression_leader") == 1
	})

	ex := exposedSeries{}
	for _, admin := range []string{g.admin, xg.admin, cpAddr} {
		resp, body := do(t, hc, http.MethodGet, "http://"+admin+"/metrics", "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %d", resp.StatusCode)
		}
		if err := parseExposition(ex, body); err != nil {
			t.Fatal(err)
		}
	}
	exempt := map[string]bool{"up": true}
	gpu := false
	for name := range ex {
		gpu = gpu || strings.HasPrefix(name, "sluice_gpu_")
	}
	if !gpu {
		// sluice_gpu_* exist only where NVML reads a GPU (the sluice-gpu build on a GPU node).
		for _, u := range uses {
			if strings.HasPrefix(u.name, "sluice_gpu_") {
				exempt[u.name] = true
			}
		}
		t.Logf("no GPU here: not checked: %v", labelValues(exempt))
	}
	for _, m := range missingFromExposition(uses, ex, recorded, exempt) {
		t.Error(m)
	}
	names := map[string]bool{}
	for _, u := range uses {
		names[u.name] = true
	}
	t.Logf("%d selectors over %d metric names checked against %d exposed names", len(uses), len(names), len(ex))
}

// hasMetric reports whether /metrics holds a sample of name.
func hasMetric(t *testing.T, hc *http.Client, admin, name string) bool {
	t.Helper()
	_, body := do(t, hc, http.MethodGet, "http://"+admin+"/metrics", "")
	return bytes.Contains(body, []byte("\n"+name+"{")) || bytes.Contains(body, []byte("\n"+name+" "))
}

// TestObservabilityChecksFail shows that the checks above catch what they are for: a
// dashboard fixture that queries a metric no gateway exposes, a label it lacks and a TTFT
// bucket that does not exist, and that breaks the structure rules (a panel without a
// datasource, one without a target, overlapping panels, an unused variable).
func TestObservabilityChecksFail(t *testing.T) {
	qs, problems, err := checkDashboard("testdata/observability/broken-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`panel "No datasource": datasource <nil>`,
		`panel "No target": no target`,
		`panels "Requests" and "Overlapping" overlap`,
		`variable unused is never used`,
	} {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("structure problem %q not reported; got %q", want, problems)
		}
	}
	var uses []selectorUse
	for _, q := range qs {
		u, err := selectorsOf(q)
		if err != nil {
			t.Fatal(err)
		}
		uses = append(uses, u...)
	}
	ex := exposedSeries{}
	if err := parseExposition(ex, []byte(`# TYPE sluice_requests_total counter
sluice_requests_total{route="chat",cluster="main",http_response_status_code="200"} 3
# TYPE gen_ai_server_time_to_first_token_seconds histogram
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_response_model="m",le="0.5"} 1
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_response_model="m",le="1"} 2
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_response_model="m",le="+Inf"} 3
gen_ai_server_time_to_first_token_seconds_sum{gen_ai_response_model="m"} 2.1
gen_ai_server_time_to_first_token_seconds_count{gen_ai_response_model="m"} 3
`)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		want string
	}{
		{"a metric no gateway exposes", "sluice_requests_totl is not on /metrics"},
		{"a label the metric lacks", "sluice_requests_total has no label status_code"},
		{"a TTFT threshold off the bucket boundaries", `has no bucket le="0.8"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := missingFromExposition(uses, ex, nil, nil)
			if !slices.ContainsFunc(got, func(m string) bool { return strings.Contains(m, tc.want) }) {
				t.Errorf("%q not reported; got %q", tc.want, got)
			}
		})
	}
	// And the fixture's good queries are not reported.
	for _, m := range missingFromExposition(uses, ex, nil, nil) {
		if strings.Contains(m, `panel "Requests"`) {
			t.Errorf("a query that exists was reported: %s", m)
		}
	}
}
