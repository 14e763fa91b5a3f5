package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/proxy/config"
)

func TestXDSBootstrapFromFileAndFlags(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bootstrap.yaml")
	if err := os.WriteFile(file, []byte("server: cp:18000\nnode_id: from-file\nlisten: 127.0.0.1:8181\nsotw: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Flags given win over the file; flags not given leave it alone.
	b, err := xdsBootstrap(file, map[string]bool{"node-id": true, "admin": true},
		xdsFlags{nodeID: "from-flag", listen: config.DefaultListen, admin: "127.0.0.1:9191"})
	if err != nil {
		t.Fatal(err)
	}
	if b.Server != "cp:18000" || b.NodeID != "from-flag" || b.Listen != "127.0.0.1:8181" || b.Admin != "127.0.0.1:9191" || b.Delta {
		t.Errorf("bootstrap = %+v", b)
	}
	// Flags alone: delta unless --xds-sotw.
	b, err = xdsBootstrap("", map[string]bool{"xds": true}, xdsFlags{server: "127.0.0.1:18000", listen: config.DefaultListen, admin: config.DefaultAdminListen})
	if err != nil {
		t.Fatal(err)
	}
	if !b.Delta || b.NodeID == "" || b.Listen != config.DefaultListen {
		t.Errorf("bootstrap from flags = %+v", b)
	}
}

func TestServeXDSFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--xds", "nohostport"}, `server: "nohostport" is not host:port`},
		{[]string{"serve", "--xds", "127.0.0.1:1", "--upstream", "http://127.0.0.1:2"}, "either --xds/--bootstrap or --config/--upstream"},
		{[]string{"serve", "--bootstrap", "testdata/no-such-bootstrap.yaml"}, "read bootstrap"},
	} {
		var out, errb bytes.Buffer
		if code := run(tt.args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 1 and %q", tt.args, code, errb.String(), tt.want)
		}
	}
}
