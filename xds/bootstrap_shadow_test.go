package xds_test

import (
	"os"
	"path/filepath"
	"strings"
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

// TestBootstrapNodeID: the node id also names the replica in the shadow store
// (shadow.instance), so it takes the same bounds.
func TestBootstrapNodeID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"edge-7", true},
		{"replica 1", true},
		{strings.Repeat("n", 256), true},
		{strings.Repeat("n", 257), false},
		{"edge\n7", false},
		{" edge-7", false},
	} {
		err := xds.Bootstrap{NodeID: tc.id, Server: "127.0.0.1:18000", RouteConfig: "sluice"}.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("node_id %q: %v, want ok=%v", tc.id, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "node_id") {
			t.Errorf("node_id %q: %v does not name node_id", tc.id, err)
		}
	}
}
