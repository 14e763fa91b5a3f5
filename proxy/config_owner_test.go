package proxy

import (
	"log/slog"
	"testing"

	"github.com/sluicegw/sluice/proxy/config"
)

// TestCallersConfigUntouched: with Options.Chaos (sluice serve --chaos), the server turns
// fault injection on in the config it serves, never in the caller's: New and Apply take the
// config as given, and a caller that keeps it (a reload check, an xDS client's last good
// config, a test) sees it unchanged.
func TestCallersConfigUntouched(t *testing.T) {
	yml := func(version string) *config.Config {
		t.Helper()
		cfg, err := config.Parse([]byte("# " + version + `
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: main, endpoints: [{url: "http://127.0.0.1:1"}], health_check: {disabled: true}}
routes:
  - {name: all, cluster: main}
`))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	first := yml("first")
	srv, err := New(Options{Config: first, Chaos: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st := srv.state.Load()
		st.stop()
		for _, cl := range st.clusters {
			cl.Close()
		}
		srv.shadow.close()
	})
	if first.Chaos.Enabled {
		t.Error("New turned chaos on in the caller's config")
	}
	if !srv.Config().Chaos.Enabled {
		t.Error("the served config has chaos off under Options.Chaos")
	}
	second := yml("second")
	if err := srv.Apply(second); err != nil {
		t.Fatal(err)
	}
	if second.Chaos.Enabled {
		t.Error("Apply turned chaos on in the caller's config")
	}
	if c := srv.Config(); !c.Chaos.Enabled || c.Version != second.Version {
		t.Errorf("served after Apply: version %q (want %q), chaos %v", c.Version, second.Version, c.Chaos.Enabled)
	}
}
