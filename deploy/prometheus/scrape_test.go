package prometheus

import (
	"os"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
)

// scrapeFile is the part of prometheus.yml that scrape.yaml holds.
type scrapeFile struct {
	Global        map[string]string `yaml:"global"`
	RuleFiles     []string          `yaml:"rule_files"`
	ScrapeConfigs []scrapeConfig    `yaml:"scrape_configs"`
}

type scrapeConfig struct {
	JobName       string `yaml:"job_name"`
	MetricsPath   string `yaml:"metrics_path"`
	Scheme        string `yaml:"scheme"`
	Authorization struct {
		Type            string `yaml:"type"`
		CredentialsFile string `yaml:"credentials_file"`
	} `yaml:"authorization"`
	KubernetesSDConfigs []struct {
		Role       string `yaml:"role"`
		Namespaces struct {
			Names []string `yaml:"names"`
		} `yaml:"namespaces"`
		Selectors []struct {
			Role  string `yaml:"role"`
			Label string `yaml:"label"`
			Field string `yaml:"field"`
		} `yaml:"selectors"`
	} `yaml:"kubernetes_sd_configs"`
	RelabelConfigs       []*relabel.Config `yaml:"relabel_configs"`
	MetricRelabelConfigs []*relabel.Config `yaml:"metric_relabel_configs"`
}

func parseScrape(data []byte) (scrapeFile, error) {
	var f scrapeFile
	err := decodeStrict(data, &f)
	return f, err
}

// pod is the labels Prometheus's Kubernetes discovery (role pod) gives one container port.
func pod(ns, name, app, container, port, phase string, init bool) labels.Labels {
	isInit := "false"
	if init {
		isInit = "true"
	}
	return labels.FromMap(map[string]string{
		"__address__":                     "10.0.0.7:9090",
		"__scheme__":                      "http",
		"__metrics_path__":                "/metrics",
		"job":                             "sluice",
		"__meta_kubernetes_namespace":     ns,
		"__meta_kubernetes_pod_name":      name,
		"__meta_kubernetes_pod_phase":     phase,
		"__meta_kubernetes_pod_node_name": "gpu-node-3",
		"__meta_kubernetes_pod_label_app_kubernetes_io_name":     app,
		"__meta_kubernetes_pod_label_app_kubernetes_io_instance": "edge",
		"__meta_kubernetes_pod_container_name":                   container,
		"__meta_kubernetes_pod_container_port_name":              port,
		"__meta_kubernetes_pod_container_init":                   isInit,
	})
}

// TestScrapeRelabel runs the scrape config's relabelling, with Prometheus's own code, on the
// targets Kubernetes discovery produces: it must keep exactly the admin ports of running
// Sluice pods (a native sidecar, an init container, included) and label them with
// namespace, pod and container.
func TestScrapeRelabel(t *testing.T) {
	data, err := os.ReadFile("scrape.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parseScrape(data)
	if err != nil {
		t.Fatalf("scrape.yaml: %v", err)
	}
	if len(f.ScrapeConfigs) != 1 {
		t.Fatalf("scrape.yaml: %d scrape configs, want 1", len(f.ScrapeConfigs))
	}
	sc := f.ScrapeConfigs[0]
	if sc.JobName != "sluice" {
		t.Errorf("job_name %q: the alert rules select job=\"sluice\"", sc.JobName)
	}
	if sc.Authorization.Type != "Bearer" || sc.Authorization.CredentialsFile == "" {
		t.Errorf("authorization = %+v: want a Bearer credentials_file (the metrics token)", sc.Authorization)
	}
	if len(sc.KubernetesSDConfigs) != 1 || sc.KubernetesSDConfigs[0].Role != "pod" {
		t.Errorf("kubernetes_sd_configs = %+v: want one, role pod", sc.KubernetesSDConfigs)
	}
	if len(sc.MetricRelabelConfigs) != 0 {
		t.Errorf("metric_relabel_configs: Sluice's labels (route, cluster, ...) must be left alone")
	}
	for _, tc := range []struct {
		name   string
		target labels.Labels
		want   map[string]string // nil: dropped
	}{
		{"gateway admin port", pod("inference", "sluice-7d9f", "sluice", "sluice", "admin", "Running", false),
			map[string]string{"namespace": "inference", "pod": "sluice-7d9f", "container": "sluice", "release": "edge", "node": "gpu-node-3", "job": "sluice", "__address__": "10.0.0.7:9090"}},
		{"native sidecar (init container) admin port", pod("inference", "llama-0", "sluice", "sluice", "admin", "Running", true),
			map[string]string{"namespace": "inference", "pod": "llama-0", "container": "sluice", "release": "edge", "node": "gpu-node-3", "job": "sluice", "__address__": "10.0.0.7:9090"}},
		{"gateway API port", pod("inference", "sluice-7d9f", "sluice", "sluice", "http", "Running", false), nil},
		{"model server port in the sidecar pod", pod("inference", "llama-0", "sluice", "vllm", "model", "Running", false), nil},
		{"another app's admin port", pod("inference", "other-1", "other", "other", "admin", "Running", false), nil},
		{"pending pod", pod("inference", "sluice-new", "sluice", "sluice", "admin", "Pending", false), nil},
		{"finished pod", pod("inference", "sluice-old", "sluice", "sluice", "admin", "Succeeded", false), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, keep := relabel.Process(tc.target, sc.RelabelConfigs...)
			if tc.want == nil {
				if keep {
					t.Fatalf("kept %v, want it dropped", got)
				}
				return
			}
			if !keep {
				t.Fatal("dropped, want it kept")
			}
			for k, v := range tc.want {
				if got.Get(k) != v {
					t.Errorf("label %s = %q, want %q (labels %v)", k, got.Get(k), v, got)
				}
			}
		})
	}
}

// TestScrapeParseRejects shows that parseScrape is strict: an unknown field and a bad
// relabel action are errors, so TestScrapeRelabel does not pass on a config Prometheus would
// read differently.
func TestScrapeParseRejects(t *testing.T) {
	for _, tc := range []struct{ name, yaml string }{
		{"unknown field", "scrape_configs:\n  - job_name: sluice\n    relabel_config: []\n"},
		{"unknown action", "scrape_configs:\n  - job_name: sluice\n    relabel_configs:\n      - action: keepit\n"},
		{"bad regex", "scrape_configs:\n  - job_name: sluice\n    relabel_configs:\n      - source_labels: [a]\n        regex: '('\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseScrape([]byte(tc.yaml)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
