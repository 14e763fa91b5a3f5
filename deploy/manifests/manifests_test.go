package manifests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// renders are the chart's renders the tests check: the three checked-in ones, and others that
// take the templates' other branches (testdata/values-*.yaml over a mode's values file). Each
// names the objects the user makes (not in the manifests); the page of a values file we ship
// must name them (the other renders' names are the test's choice).
var renders = []struct {
	name     string
	values   []string
	page     string   // the page that tells the user to make the provided objects, if any
	provided []string // Kind/name
	rendered string   // the checked-in file, or "" for a render made by the test
}{
	{name: "sidecar", values: []string{"sidecar.yaml"}, page: "sidecar.md", rendered: "sidecar.yaml",
		provided: []string{"Secret/sluice-tokens"}},
	{name: "edge", values: []string{"edge.yaml"}, page: "edge.md", rendered: "edge.yaml",
		provided: []string{"Secret/sluice-tokens", "Secret/sluice-tls"}},
	{name: "mesh", values: []string{"mesh.yaml"}, page: "mesh.md", rendered: "mesh.yaml",
		provided: []string{"Secret/sluice-tokens"}},
	// The chart makes the tokens' Secret; one replica keeps its shadow store on a claim.
	{name: "edge with a made Secret and a claim", values: []string{"edge.yaml", "testdata/values-edge-claim.yaml"},
		provided: []string{"PersistentVolumeClaim/sluice-shadow"}},
	// A sidecar without NVML, its weights on a claim, a gated model's token, rolled on change.
	{name: "sidecar without NVML", values: []string{"sidecar.yaml", "testdata/values-sidecar-claim.yaml"},
		provided: []string{"Secret/sluice-tokens", "Secret/hf-token", "PersistentVolumeClaim/models"}},
	// Mesh replicas with TLS, an autoscaler and the shadow store on the node's disk.
	{name: "mesh with TLS and autoscaling", values: []string{"mesh.yaml", "testdata/values-mesh-tls.yaml"},
		provided: []string{"Secret/sluice-tokens", "Secret/sluice-tls"}},
	// Mesh replicas following another control plane over mutual TLS.
	{name: "mesh with another control plane", values: []string{"mesh.yaml", "testdata/values-mesh-external.yaml"},
		page: "envoy-control-plane.md", provided: []string{"Secret/sluice-tokens", "Secret/sluice-xds-client"}},
}

func renderFor(t *testing.T, values []string) []byte {
	t.Helper()
	files := make([]string, len(values))
	for i, v := range values {
		if strings.HasPrefix(v, "testdata/") {
			files[i] = v
		} else {
			files[i] = filepath.Join(valuesDir, v)
		}
	}
	out, err := Render(chartDir, files...)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(out)
}

// TestManifests checks every document of every render (checkManifests): strict decoding into
// the API types and the references a cluster would otherwise reject at apply time or, worse,
// accept. The objects a render expects the user to make are named on its page.
func TestManifests(t *testing.T) {
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			var data []byte
			if r.rendered != "" {
				var err error
				if data, err = os.ReadFile(filepath.Join(renderedDir, r.rendered)); err != nil {
					t.Fatal(err)
				}
			} else {
				data = renderFor(t, r.values)
			}
			provided := map[string]bool{}
			for _, obj := range r.provided {
				provided[obj] = true
			}
			if r.page != "" {
				page, err := os.ReadFile(filepath.Join("..", r.page))
				if err != nil {
					t.Fatal(err)
				}
				for _, obj := range r.provided {
					if name := obj[strings.Index(obj, "/")+1:]; !strings.Contains(string(page), name) {
						t.Errorf("deploy/%s does not name %s, which the user must make", r.page, obj)
					}
				}
			}
			for _, p := range checkManifests(data, provided) {
				t.Error(p)
			}
		})
	}
}

// TestChecksCatchBrokenManifests: each check fails on a manifest broken in its way
// (testdata/broken-*.yaml, each testdata/good.yaml with one fault), and good.yaml passes.
func TestChecksCatchBrokenManifests(t *testing.T) {
	tests := []struct {
		file string
		want string // a problem must contain it ("" for none)
	}{
		{"good.yaml", ""},
		{"broken-unknown-field.yaml", `Deployment gw (line 53): json: unknown field "imagePulPolicy"`},
		{"broken-unknown-kind.yaml", "unknown apiVersion/kind networking.k8s.io/v1/Ingress"},
		{"broken-wrong-type.yaml", "cannot unmarshal string into Go struct field"},
		{"broken-duplicate-key.yaml", `key "imagePullPolicy" already set in map`},
		{"broken-selector.yaml", "Service gw: selector map[app.kubernetes.io/component:gatway app.kubernetes.io/name:gw] selects no pod template"},
		{"broken-target-port.yaml", "Service gw: port http: targetPort api is not a container port of Deployment gw"},
		{"broken-probe-port.yaml", "container gw: readinessProbe: port adm is not a port of the container"},
		{"broken-configmap.yaml", "volume \"config\": ConfigMap gw-conf is neither in the manifests nor made by the user"},
		{"broken-secret-key.yaml", "env SLUICE_ADMIN_TOKEN: Secret gw-tokens has no key \"admin\""},
		{"broken-root.yaml", "container gw: readOnlyRootFilesystem is not true"},
		{"broken-hpa.yaml", "HorizontalPodAutoscaler gw: Deployment gw sets replicas"},
		{"broken-servicemonitor.yaml", "ServiceMonitor gw: endpoints[0].port \"metrics\" is not a port of Service gw"},
		{"broken-model-port.yaml", "Service gw: port http: targetPort model is container model's (vllm/vllm-openai:v0.11.0), not Sluice's"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			got := checkManifests(data, map[string]bool{})
			if tt.want == "" {
				for _, p := range got {
					t.Errorf("unexpected problem: %s", p)
				}
				return
			}
			if !strings.Contains(strings.Join(got, "\n"), tt.want) {
				t.Errorf("problems %q\nlack %q", got, tt.want)
			}
		})
	}
}

// TestRenderRefuses: values that would deploy something broken fail the render with a
// message that says what to set instead.
func TestRenderRefuses(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   string
	}{
		{"no mode", []string{"testdata/values-no-mode.yaml"}, "mode is required"},
		{"a misspelt value", []string{"edge.yaml", "testdata/values-misspelt.yaml"}, "additional properties 'replica' not allowed"},
		{"a mode that is not one", []string{"testdata/values-bad-mode.yaml"}, "at '/mode'"},
		{"a chart-owned key", []string{"edge.yaml", "testdata/values-owned-listen.yaml"}, "config.listen is set by the chart: set ports.http instead"},
		{"a chart-owned admin key", []string{"sidecar.yaml", "testdata/values-owned-admin.yaml"}, "config.admin.listen is set by the chart: set ports.admin instead"},
		{"a replica's key in the fleet's config", []string{"mesh.yaml", "testdata/values-fleet-listen.yaml"}, "config.listen: in mode mesh config is the fleet's config"},
		{"one claim, several replicas", []string{"edge.yaml", "testdata/values-claim-replicas.yaml"}, "shadowStore.volume existingClaim holds one replica's SQLite file"},
		{"TLS without a Secret", []string{"edge.yaml", "testdata/values-tls-no-secret.yaml"}, "tls.secretName is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := make([]string, len(tt.values))
			for i, v := range tt.values {
				if strings.HasPrefix(v, "testdata/") {
					files[i] = v
				} else {
					files[i] = filepath.Join(valuesDir, v)
				}
			}
			_, err := Render(chartDir, files...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("render error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestPageLinks: every relative link of the pages of this part of deploy/ names a file that
// exists.
func TestPageLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range []string{"../sidecar.md", "../edge.md", "../mesh.md", "../envoy-control-plane.md", "../chart/sluice/README.md"} {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(page), target)); err != nil {
				t.Errorf("%s: link %s: %v", page, m[1], err)
			}
		}
	}
}
