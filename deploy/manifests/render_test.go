package manifests

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite deploy/rendered/*.yaml from the chart")

const (
	chartDir    = "../chart/sluice"
	valuesDir   = "../values"
	renderedDir = "../rendered"
)

// modes are the ways of running, each with its values file and its rendered manifests.
var modes = []string{"sidecar", "edge", "mesh"}

// TestRenderedUpToDate: deploy/rendered/MODE.yaml is the chart rendered with
// deploy/values/MODE.yaml, byte for byte (go test ./deploy/manifests -update rewrites them).
func TestRenderedUpToDate(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			got, err := Render(chartDir, filepath.Join(valuesDir, mode+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(renderedDir, mode+".yaml")
			if *update {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (go test ./deploy/manifests -update writes it)", err)
			}
			if !bytes.Equal(want, []byte(got)) {
				t.Errorf("%s is out of date with the chart and %s.yaml: run go test ./deploy/manifests -update\n%s",
					file, mode, firstDiff(string(want), got))
			}
		})
	}
}
