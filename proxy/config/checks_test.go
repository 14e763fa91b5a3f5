package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/gpu"
	"github.com/sluicegw/sluice/proxy/upstream"
)

func TestSignalChecksDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	ck := c.LoadSignals.Checks
	want := SignalChecks{
		KVLeak: LeakCheck{MinKVUsage: 0.1, For: Duration(5 * time.Minute), ClearBelow: 0.05},
		Stall:  StallCheck{Window: Duration(30 * time.Second), MinWaiting: 2, MaxThroughputRatio: 0.5},
	}
	if ck != want {
		t.Errorf("checks %+v, want %+v", ck, want)
	}
	if err := ck.GPU().Validate(); err != nil {
		t.Errorf("defaults rejected by package gpu: %v", err)
	}
	if cl := c.Clusters[0]; cl.Picking.FlaggedWeight != upstream.DefaultFlaggedWeight || cl.Outlier.EjectFlagged {
		t.Errorf("cluster picking %+v, outlier %+v", cl.Picking, cl.Outlier)
	}

	c, err = Parse([]byte(`
load_signals:
  checks:
    kv_leak: {min_kv_usage: 0.4, for: 2m}
    stall: {window: 1m, min_waiting: 8, max_throughput_ratio: 0.25, disabled: true}
clusters:
  - name: a
    endpoints: [{url: "http://127.0.0.1:8000"}]
    picking: {flagged_weight: 0.5}
    outlier: {eject_flagged: true}
routes:
  - {name: r, cluster: a}
`))
	if err != nil {
		t.Fatal(err)
	}
	g := c.LoadSignals.Checks.GPU()
	wantG := gpu.Checks{
		Leak:  gpu.LeakCheck{MinKVUsage: 0.4, For: 2 * time.Minute, ClearBelow: 0.2},
		Stall: gpu.StallCheck{Disabled: true, Window: time.Minute, MinWaiting: 8, MaxThroughputRatio: 0.25},
	}
	if g != wantG {
		t.Errorf("gpu checks %+v, want %+v", g, wantG)
	}
	if cl := c.Clusters[0]; cl.Picking.FlaggedWeight != 0.5 || !cl.Outlier.EjectFlagged {
		t.Errorf("cluster picking %+v, outlier %+v", cl.Picking, cl.Outlier)
	}
}

func TestSignalChecksValidate(t *testing.T) {
	_, err := Parse([]byte(`
load_signals:
  checks:
    kv_leak: {min_kv_usage: 0.2, clear_below: 0.3, for: -1s}
    stall: {window: -1s, min_waiting: -1, max_throughput_ratio: 1}
clusters:
  - name: a
    endpoints: [{url: "http://127.0.0.1:8000"}]
    picking: {flagged_weight: 2}
  - name: b
    endpoints: [{url: "http://127.0.0.1:8001"}]
    picking: {flagged_weight: -0.5}
routes:
  - {name: r, cluster: a}
`))
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want a ValidationError, got %v", err)
	}
	want := []string{
		"load_signals.checks.kv_leak.clear_below: 0.3 must be below min_kv_usage 0.2",
		"load_signals.checks.kv_leak.for: must not be negative",
		"load_signals.checks.stall.window: must not be negative",
		"load_signals.checks.stall.min_waiting: -1 is not within 0..1e9",
		"load_signals.checks.stall.max_throughput_ratio: 1 is not within 0..1 (1 excluded)",
		"clusters[0].picking.flagged_weight: 2 is not within 0..1",
		"clusters[1].picking.flagged_weight: -0.5 is not within 0..1",
	}
	for _, w := range want {
		found := false
		for _, p := range ve.Problems {
			found = found || strings.HasPrefix(p, w)
		}
		if !found {
			t.Errorf("missing problem %q in:\n%s", w, strings.Join(ve.Problems, "\n"))
		}
	}
	if len(ve.Problems) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(ve.Problems), len(want), strings.Join(ve.Problems, "\n"))
	}

	_, err = Parse([]byte(`
load_signals:
  checks:
    kv_leak: {min_kv_usage: 1.5}
clusters:
  - name: a
    endpoints: [{url: "http://127.0.0.1:8000"}]
routes:
  - {name: r, cluster: a}
`))
	if !errors.As(err, &ve) || len(ve.Problems) != 1 || !strings.Contains(ve.Problems[0], "kv_leak.min_kv_usage: 1.5 is not within 0..1") {
		t.Errorf("out-of-range min_kv_usage: %v", err)
	}
}
