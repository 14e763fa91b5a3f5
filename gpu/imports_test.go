package gpu

import (
	"go/build"
	"strings"
	"testing"
)

// TestImportsNoPolicies: gpu is below the policies and the proxy (they read its signals): it
// takes only the leaf clock package of Sluice's own.
func TestImportsNoPolicies(t *testing.T) {
	for _, tags := range [][]string{nil, {"nvml"}} {
		ctx := build.Default
		ctx.BuildTags = tags
		pkg, err := ctx.ImportDir(".", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range pkg.Imports {
			if strings.HasPrefix(imp, "github.com/sluicegw/sluice/") && imp != "github.com/sluicegw/sluice/policy/clock" {
				t.Errorf("gpu (tags %v) imports %s", tags, imp)
			}
		}
	}
}
