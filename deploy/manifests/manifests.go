// Package manifests renders the Sluice Helm chart (deploy/chart/sluice) as `helm template`
// does, with Helm's own packages, and splits the output into its documents. Its tests keep
// deploy/rendered/ in sync with the chart and check every rendered document: strict decoding
// into the Kubernetes API types, and the references between objects that a cluster would
// otherwise only reject (or, worse, accept) at apply time.
package manifests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"sigs.k8s.io/yaml"
)

// Release is the release the checked-in manifests are rendered for: `helm template sluice
// deploy/chart/sluice --namespace default --kube-version 1.30 -f deploy/values/MODE.yaml`. The
// templates set no namespace, so the plain manifests apply to any namespace (kubectl apply -n).
const (
	ReleaseName = "sluice"
	Namespace   = "default"
	KubeVersion = "v1.30.0"
)

// Render renders the chart in chartDir with the values files given (later files win, as with
// helm's -f), and returns the manifests exactly as `helm template` prints them: every
// non-empty document in install order, each preceded by its "# Source:" line.
func Render(chartDir string, valuesFiles ...string) (string, error) {
	ch, err := loader.LoadDir(chartDir)
	if err != nil {
		return "", fmt.Errorf("load chart %s: %w", chartDir, err)
	}
	vals := map[string]any{}
	for _, f := range valuesFiles {
		v, err := chartutil.ReadValuesFile(f)
		if err != nil {
			return "", fmt.Errorf("values %s: %w", f, err)
		}
		vals = mergeMaps(vals, v.AsMap())
	}
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		return "", fmt.Errorf("kube version: %w", err)
	}
	if ch.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kv.String()) {
		return "", fmt.Errorf("chart requires kubeVersion %s, incompatible with %s", ch.Metadata.KubeVersion, kv)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	if err := chartutil.ProcessDependenciesWithMerge(ch, vals); err != nil {
		return "", fmt.Errorf("dependencies: %w", err)
	}
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: ReleaseName, Namespace: Namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return "", fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return "", fmt.Errorf("render: %w", err)
	}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	hooks, ms, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return "", fmt.Errorf("sort manifests: %w", err)
	}
	var b bytes.Buffer
	for _, m := range ms {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	out := strings.TrimSpace(b.String()) + "\n"
	for _, h := range hooks {
		out += fmt.Sprintf("---\n# Source: %s\n%s\n", h.Path, h.Manifest)
	}
	return out, nil
}

// mergeMaps merges b into a as helm's -f does: maps merge key by key, anything else in b
// replaces a's.
func mergeMaps(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bv, ok := v.(map[string]any); ok {
			if av, ok := out[k].(map[string]any); ok {
				out[k] = mergeMaps(av, bv)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// Document is one object of a rendered file.
type Document struct {
	// Source is the template it came from ("sluice/templates/service.yaml").
	Source string
	// Line is the line of its "---" in the file (1-based).
	Line       int
	APIVersion string
	Kind       string
	Name       string
	// JSON is the document as JSON (sigs.k8s.io/yaml's strict conversion), for strict
	// decoding.
	JSON []byte
}

func (d Document) String() string {
	if d.Source == "" {
		return fmt.Sprintf("%s %s (line %d)", d.Kind, d.Name, d.Line)
	}
	return fmt.Sprintf("%s %s (%s, line %d)", d.Kind, d.Name, d.Source, d.Line)
}

// Split splits a rendered file into its documents; empty documents are skipped.
func Split(data []byte) ([]Document, error) {
	var docs []Document
	lines := strings.Split(string(data), "\n")
	start, source := 0, ""
	flush := func(end int) error {
		body := strings.Join(lines[start:end], "\n")
		if strings.TrimSpace(stripComments(body)) == "" {
			return nil
		}
		// Strict: a key twice in a mapping is an error (a non-strict conversion keeps the last).
		js, err := yaml.YAMLToJSONStrict([]byte(body))
		if err != nil {
			return fmt.Errorf("document at line %d (%s): %w", start, source, err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(js, &head); err != nil {
			return fmt.Errorf("document at line %d (%s): %w", start, source, err)
		}
		docs = append(docs, Document{Source: source, Line: start, APIVersion: head.APIVersion, Kind: head.Kind,
			Name: head.Metadata.Name, JSON: js})
		return nil
	}
	for i, l := range lines {
		if l == "---" {
			if err := flush(i); err != nil {
				return nil, err
			}
			start, source = i+1, ""
			continue
		}
		if s, ok := strings.CutPrefix(l, "# Source: "); ok && source == "" {
			source = s
		}
	}
	if err := flush(len(lines)); err != nil {
		return nil, err
	}
	return docs, nil
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
