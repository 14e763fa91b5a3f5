package xds_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicegw/sluice/xds"
)

// TestBootstrapShadowStore: a relative shadow_store file is taken from the bootstrap's
// directory; the URL of a store the fleet shares is kept as it is.
func TestBootstrapShadowStore(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ store, want string }{
		{"shadow.db", filepath.Join(dir, "shadow.db")},
		{"/var/lib/sluice/shadow.db", "/var/lib/sluice/shadow.db"},
		{"postgres://sluice@db.internal:5432/shadow?sslmode=require", "postgres://sluice@db.internal:5432/shadow?sslmode=require"},
		{"postgresql:///shadow?host=/run/postgresql", "postgresql:///shadow?host=/run/postgresql"},
	} {
		file := filepath.Join(dir, "bootstrap.yaml")
		if err := os.WriteFile(file, []byte("server: cp.internal:18000\nshadow_store: \""+tc.store+"\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := xds.LoadBootstrap(file)
		if err != nil {
			t.Fatal(err)
		}
		if b.ShadowStore != tc.want {
			t.Errorf("shadow_store %q loaded as %q, want %q", tc.store, b.ShadowStore, tc.want)
		}
	}
}
