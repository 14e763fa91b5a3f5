package upstream

import (
	"math"
	"strings"
	"testing"
)

func TestValidatePicking(t *testing.T) {
	src := newFakeLoad(newFakeClock())
	tests := []struct {
		name string
		load LoadSource
		pk   Picking
		want []string // substrings of the error; none: valid
	}{
		{"zero", nil, Picking{}, nil},
		{"zero with load", src, Picking{}, nil},
		{"least in-flight with load", src, Picking{Strategy: StrategyLeastInFlight}, nil},
		{"load aware", src, Picking{Strategy: StrategyLoadAware, WaitingWeight: 2, KVWeight: 0, InFlightWeight: 0.5,
			AffinityMaxLoad: 1.5, AffinityMinPrefix: 1024}, nil},
		{"affinity off", nil, Picking{DisableAffinity: true}, nil},
		{"load aware without load", nil, Picking{Strategy: StrategyLoadAware},
			[]string{"picking.strategy: load_aware needs a load source"}},
		{"flagged weight NaN", src, Picking{FlaggedWeight: math.NaN()}, []string{"picking.flagged_weight: must be within 0..1 (0 means 0.1), got NaN"}},
		{"unknown strategy", src, Picking{Strategy: "random"}, []string{`picking.strategy: must be "least_inflight" or "load_aware", got "random"`}},
		{"flagged weight 1", src, Picking{FlaggedWeight: 1}, nil},
		{"bad numbers", src, Picking{InFlightWeight: -1, WaitingWeight: math.NaN(), KVWeight: math.Inf(1),
			AffinityMaxLoad: -2, AffinityMinPrefix: -1, FlaggedWeight: 1.5},
			[]string{
				"picking.flagged_weight: must be within 0..1 (0 means 0.1), got 1.5",
				"picking.inflight_weight: must be between 0 and 1e+06, got -1",
				"picking.waiting_weight: must be between 0 and 1e+06, got NaN",
				"picking.kv_weight: must be between 0 and 1e+06, got +Inf",
				"picking.affinity_max_load: must be between 0 and 1e+06, got -2",
				"picking.affinity_min_prefix: must not be negative",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Options{Name: "a", Endpoints: specs(2), Load: tt.load, Picking: tt.pk}.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate = nil")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%v", w, err)
				}
			}
			if n := len(strings.Split(err.Error(), "\n")); n != len(tt.want) {
				t.Errorf("%d errors, want %d:\n%v", n, len(tt.want), err)
			}
		})
	}
}

func TestPickingDefaults(t *testing.T) {
	src := newFakeLoad(newFakeClock())
	tests := []struct {
		name string
		load LoadSource
		pk   Picking
		want Picking
		read bool // the picker reads the source
	}{
		{"no load", nil, Picking{},
			Picking{Strategy: StrategyLeastInFlight, InFlightWeight: 1, WaitingWeight: 1, KVWeight: 4, AffinityMaxLoad: 2, AffinityMinPrefix: 256, LoadCache: DefaultLoadCache, FlaggedWeight: DefaultFlaggedWeight}, false},
		{"load", src, Picking{},
			Picking{Strategy: StrategyLoadAware, InFlightWeight: 1, WaitingWeight: 1, KVWeight: 4, AffinityMaxLoad: 2, AffinityMinPrefix: 256, LoadCache: DefaultLoadCache, FlaggedWeight: DefaultFlaggedWeight}, true},
		{"load, least in-flight asked", src, Picking{Strategy: StrategyLeastInFlight},
			Picking{Strategy: StrategyLeastInFlight, InFlightWeight: 1, WaitingWeight: 1, KVWeight: 4, AffinityMaxLoad: 2, AffinityMinPrefix: 256, LoadCache: DefaultLoadCache, FlaggedWeight: DefaultFlaggedWeight}, false},
		{"one weight set keeps the others at zero", src, Picking{WaitingWeight: 3, AffinityMaxLoad: 0.5, AffinityMinPrefix: 1, LoadCache: -1},
			Picking{Strategy: StrategyLoadAware, WaitingWeight: 3, AffinityMaxLoad: 0.5, AffinityMinPrefix: 1, LoadCache: -1, FlaggedWeight: DefaultFlaggedWeight}, true},
		{"flagged weight kept", src, Picking{FlaggedWeight: 0.5},
			Picking{Strategy: StrategyLoadAware, InFlightWeight: 1, WaitingWeight: 1, KVWeight: 4, AffinityMaxLoad: 2, AffinityMinPrefix: 256, LoadCache: DefaultLoadCache, FlaggedWeight: 0.5}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCluster(t, Options{Endpoints: specs(2), Load: tt.load, Picking: tt.pk})
			if c.opts.Picking != tt.want {
				t.Errorf("Picking = %+v, want %+v", c.opts.Picking, tt.want)
			}
			if got := c.pk.load != nil; got != tt.read {
				t.Errorf("picker reads the load source = %v, want %v", got, tt.load)
			}
		})
	}
}
