package manifests

import (
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// TestLint runs helm lint (its Go package, as `helm lint --strict`, which fails on warnings)
// on the chart with each values file: no message but informational ones (Helm's "icon is
// recommended", for a chart without an icon). The last case shows that the test sees an error
// (values that values.schema.json refuses). Lint renders in Helm's lint mode, where `fail` and
// `required` only log: TestRenderRefuses checks those.
func TestLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		values string // a values file; or
		inline map[string]any
		want   string // an error the lint must report; "" for none
	}{
		{name: "sidecar", values: filepath.Join(valuesDir, "sidecar.yaml")},
		{name: "edge", values: filepath.Join(valuesDir, "edge.yaml")},
		{name: "mesh", values: filepath.Join(valuesDir, "mesh.yaml")},
		{name: "labels that are not a map", inline: map[string]any{"mode": "edge", "config": map[string]any{}, "podLabels": "team=a"},
			want: "at '/podLabels': got string, want object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vals := tt.inline
			if tt.values != "" {
				v, err := chartutil.ReadValuesFile(tt.values)
				if err != nil {
					t.Fatal(err)
				}
				vals = v
			}
			log.SetOutput(io.Discard) // lint mode logs every fail and required
			l := lint.AllWithKubeVersion(chartDir, vals, Namespace, kv)
			log.SetOutput(os.Stderr)
			var problems []string
			for _, m := range l.Messages {
				switch {
				case m.Severity >= support.WarningSev:
					problems = append(problems, m.Error())
				case m.Severity == support.InfoSev && strings.Contains(m.Err.Error(), "icon is recommended"):
				default:
					problems = append(problems, "unexpected message: "+m.Error())
				}
			}
			if tt.want == "" {
				for _, p := range problems {
					t.Errorf("helm lint: %s", p)
				}
				return
			}
			if len(problems) == 0 || !strings.Contains(strings.Join(problems, "\n"), tt.want) {
				t.Errorf("helm lint reported %q, want a problem containing %q", problems, tt.want)
			}
		})
	}
}
