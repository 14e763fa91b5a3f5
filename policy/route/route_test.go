package route

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

func twoSplits(a, b int) Spec {
	return Spec{Splits: []Split{
		{Cluster: "primary", Weight: a},
		{Cluster: "candidate", Weight: b, GrayFlag: "v2", Model: "llama-3-70b-v2"},
	}}
}

// within fails unless got is within tol of want (shares, absolute).
func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol {
		t.Errorf("%s: share %.4f, want %.4f ± %.4f", what, got, want, tol)
	} else {
		t.Logf("%s: share %.4f (want %.4f ± %.4f)", what, got, want, tol)
	}
}

func TestSplitRatiosBySession(t *testing.T) {
	const n = 20000
	for _, tc := range []struct {
		name    string
		weights []int
	}{
		{"95/5", []int{95, 5}},
		{"50/50", []int{50, 50}},
		{"70/20/10", []int{70, 20, 10}},
		{"1/1/1/1", []int{1, 1, 1, 1}},
		{"999/1", []int{999, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Spec
			total := 0
			for i, w := range tc.weights {
				s.Splits = append(s.Splits, Split{Cluster: fmt.Sprintf("c%d", i), Weight: w})
				total += w
			}
			rt := mustNew(t, s, "", "")
			counts := map[string]int{}
			for i := range n {
				counts[splitOf(rt, req(fmt.Sprintf("session-%d", i)))]++
			}
			chi2 := 0.0
			for i, w := range tc.weights {
				p := float64(w) / float64(total)
				got := float64(counts[fmt.Sprintf("c%d", i)]) / n
				// 5 binomial σ, at least 1% absolute as the brief asks.
				tol := max(5*math.Sqrt(p*(1-p)/n), 0.01)
				within(t, fmt.Sprintf("c%d", i), got, p, tol)
				e := p * n
				chi2 += (float64(counts[fmt.Sprintf("c%d", i)]) - e) * (float64(counts[fmt.Sprintf("c%d", i)]) - e) / e
			}
			// χ² with k-1 ≤ 3 degrees of freedom: 16.27 is its 0.999 quantile at 3 d.o.f.
			if chi2 > 16.27 {
				t.Errorf("χ² = %.2f over %v: the split is not weighted as configured", chi2, counts)
			}
		})
	}
}

func TestRandomSpreadWithoutKey(t *testing.T) {
	rt := mustNew(t, Spec{Splits: []Split{{Cluster: "a", Weight: 80}, {Cluster: "b", Weight: 20}, {Cluster: "z", Weight: 0}}}, "", "")
	const n = 20000
	counts := map[string]int{}
	for range n {
		counts[splitOf(rt, req(""))]++
	}
	within(t, "a", float64(counts["a"])/n, 0.8, 0.015)
	within(t, "b", float64(counts["b"])/n, 0.2, 0.015)
	if counts["z"] != 0 {
		t.Errorf("weight-0 split got %d unflagged requests", counts["z"])
	}
}

func TestGrayFlag(t *testing.T) {
	for _, w := range [][2]int{{95, 5}, {100, 0}, {0, 100}} {
		t.Run(fmt.Sprintf("%d/%d", w[0], w[1]), func(t *testing.T) {
			rt := mustNew(t, twoSplits(w[0], w[1]), "primary", "")
			for i := range 2000 {
				r := req(fmt.Sprintf("s%d", i))
				r.GrayFlag = "v2"
				if plan := rt.Plan(context.Background(), r); plan[0].Split != "candidate" || plan[0].Model != "llama-3-70b-v2" {
					t.Fatalf("flagged request planned %+v, want the candidate split", plan[0])
				}
			}
			// An unknown flag is an ordinary request.
			r := req("")
			r.GrayFlag = "v3"
			if w[1] == 0 && splitOf(rt, r) != "primary" {
				t.Errorf("unknown flag went to %q", splitOf(rt, r))
			}
		})
	}
}

func TestGrayFlagCustomHeader(t *testing.T) {
	s := twoSplits(100, 0)
	s.GrayFlagHeader = "x-canary"
	rt := mustNew(t, s, "", "")
	r := req("s")
	r.GrayFlag = "v2" // the default header's value: not the one configured
	if got := splitOf(rt, r); got != "primary" {
		t.Errorf("x-gray-flag used though gray_flag_header is x-canary: %q", got)
	}
	r.Header.Set("X-Canary", "v2")
	if got := splitOf(rt, r); got != "candidate" {
		t.Errorf("x-canary: v2 went to %q", got)
	}
}

func TestGrayOnlySplitsServeOthersOnPrimary(t *testing.T) {
	rt := mustNew(t, Spec{Splits: []Split{{Cluster: "canary", GrayFlag: "v2"}}, Fallback: []Step{{Cluster: "fb"}}}, "main", "m")
	if plan := rt.Plan(context.Background(), req("x")); plan[0].Cluster != "main" || plan[0].Model != "m" || len(plan) != 2 {
		t.Errorf("unflagged plan %+v, want main then fb", plan)
	}
	r := req("x")
	r.GrayFlag = "v2"
	if plan := rt.Plan(context.Background(), r); plan[0].Cluster != "canary" || plan[0].Model != "m" {
		t.Errorf("flagged plan %+v, want canary with the route's model", plan)
	}
	if _, err := New(Spec{Splits: []Split{{Cluster: "canary", GrayFlag: "v2"}}}, "", "", nil); err == nil {
		t.Error("gray-only splits without a route cluster were accepted")
	}
}

func TestStickiness(t *testing.T) {
	rt := mustNew(t, Spec{Splits: []Split{{Cluster: "a", Weight: 50}, {Cluster: "b", Weight: 30}, {Cluster: "c", Weight: 20}}}, "", "")
	for i := range 500 {
		id := fmt.Sprintf("sess-%d", i)
		first := splitOf(rt, req(id))
		for range 20 {
			if got := splitOf(rt, req(id)); got != first {
				t.Fatalf("session %s moved from %s to %s", id, first, got)
			}
		}
	}
	// Another Router from the same config (another replica) agrees.
	rt2 := mustNew(t, rt.Spec(), "", "")
	for i := range 500 {
		id := fmt.Sprintf("sess-%d", i)
		if splitOf(rt, req(id)) != splitOf(rt2, req(id)) {
			t.Fatalf("two routers disagree on session %s", id)
		}
	}
}

func TestStickySources(t *testing.T) {
	s := Spec{Splits: []Split{{Cluster: "a", Weight: 50}, {Cluster: "b", Weight: 50}}}
	rt := mustNew(t, s, "", "")
	// Find a user and a key that land on different splits than a session id, to see which
	// source was used.
	bySource := func(mod func(*policy.Request)) string {
		r := req("")
		mod(r)
		return splitOf(rt, r)
	}
	const tries = 200
	for _, tc := range []struct {
		name string
		mod  func(r *policy.Request, v string)
	}{
		{"header", func(r *policy.Request, v string) { r.Header.Set("X-Session-ID", v) }},
		{"body:user", func(r *policy.Request, v string) { r.User = v }},
		{"key", func(r *policy.Request, v string) { r.Header.Set("Authorization", "Bearer "+v) }},
		{"tenant as key", func(r *policy.Request, v string) { r.Tenant = v }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tries {
				v := fmt.Sprintf("v%d", i)
				first := bySource(func(r *policy.Request) { tc.mod(r, v) })
				for range 5 {
					if got := bySource(func(r *policy.Request) { tc.mod(r, v) }); got != first {
						t.Fatalf("%s %q not sticky: %s then %s", tc.name, v, first, got)
					}
				}
			}
		})
	}
	// Order: the header wins over the user, the user over the key.
	for i := range tries {
		a, b := fmt.Sprintf("x%d", i), fmt.Sprintf("y%d", i)
		hdr := bySource(func(r *policy.Request) { r.Header.Set("X-Session-ID", a) })
		both := bySource(func(r *policy.Request) { r.Header.Set("X-Session-ID", a); r.User = b })
		if hdr != both {
			t.Fatalf("user %q overrode session header %q", b, a)
		}
		user := bySource(func(r *policy.Request) { r.User = a })
		withKey := bySource(func(r *policy.Request) { r.User = a; r.Header.Set("Authorization", "Bearer "+b) })
		if user != withKey {
			t.Fatalf("key overrode user %q", a)
		}
	}

	// Custom sources: only the tenant.
	s.Sticky = []string{"tenant"}
	rt = mustNew(t, s, "", "")
	for i := range tries {
		r := req(fmt.Sprintf("s%d", i))
		r.Tenant = "team-a"
		if got, want := splitOf(rt, r), splitOf(rt, &policy.Request{Tenant: "team-a"}); got != want {
			t.Fatalf("sticky [tenant]: session header changed the split")
		}
	}
}

func TestStickyNoneSpreadsSessions(t *testing.T) {
	s := Spec{Splits: []Split{{Cluster: "a", Weight: 50}, {Cluster: "b", Weight: 50}}, Sticky: []string{"none"}}
	rt := mustNew(t, s, "", "")
	seen := map[string]bool{}
	for range 200 {
		seen[splitOf(rt, req("same"))] = true
	}
	if len(seen) != 2 {
		t.Errorf("sticky [none]: one session always went to %v", seen)
	}
}

func TestWeightChangeMovesOnlySessionsItMust(t *testing.T) {
	const n = 20000
	rt := mustNew(t, twoSplits(95, 5), "", "")
	before := make([]string, n)
	for i := range before {
		before[i] = splitOf(rt, req(fmt.Sprintf("session-%d", i)))
	}
	if err := rt.SetWeights(map[string]int{"primary": 90, "candidate": 10}); err != nil {
		t.Fatal(err)
	}
	moved, wrongWay, onCandidate := 0, 0, 0
	for i := range before {
		after := splitOf(rt, req(fmt.Sprintf("session-%d", i)))
		if after == "candidate" {
			onCandidate++
		}
		if after != before[i] {
			moved++
			if after != "candidate" {
				wrongWay++
			}
		}
	}
	if wrongWay != 0 {
		t.Errorf("%d sessions moved away from the split whose weight increased", wrongWay)
	}
	within(t, "moved", float64(moved)/n, 0.05, 0.01)
	within(t, "candidate after", float64(onCandidate)/n, 0.10, 0.01)

	// And back: the same sessions return, nobody else moves.
	if err := rt.SetWeights(map[string]int{"primary": 95, "candidate": 5}); err != nil {
		t.Fatal(err)
	}
	for i := range before {
		if got := splitOf(rt, req(fmt.Sprintf("session-%d", i))); got != before[i] {
			t.Fatalf("session %d: %s after restoring the weights, was %s", i, got, before[i])
		}
	}
}

func TestAddingASplitTakesOnlyItsShare(t *testing.T) {
	const n = 20000
	s := Spec{Splits: []Split{{Cluster: "a", Weight: 50}, {Cluster: "b", Weight: 50}, {Cluster: "c", Weight: 0}}}
	rt := mustNew(t, s, "", "")
	before := make([]string, n)
	for i := range before {
		before[i] = splitOf(rt, req(fmt.Sprintf("u%d", i)))
	}
	if err := rt.SetWeights(map[string]int{"c": 25}); err != nil { // a and b keep 50
		t.Fatal(err)
	}
	moved := 0
	for i := range before {
		after := splitOf(rt, req(fmt.Sprintf("u%d", i)))
		if after != before[i] {
			moved++
			if after != "c" {
				t.Fatalf("session moved %s → %s", before[i], after)
			}
		}
	}
	within(t, "moved to the new split", float64(moved)/n, 0.2, 0.01)
}

func TestSetWeightsErrors(t *testing.T) {
	rt := mustNew(t, twoSplits(95, 5), "", "")
	for _, tc := range []struct {
		w    map[string]int
		want string
	}{
		{map[string]int{"nope": 1}, `weights: unknown split "nope"`},
		{map[string]int{"primary": -1}, "weights[primary]: -1 is negative"},
		{map[string]int{"primary": 0, "candidate": 0}, "every split would have weight 0"},
	} {
		err := rt.SetWeights(tc.w)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetWeights(%v) = %v, want %q", tc.w, err, tc.want)
		}
	}
	if got := rt.Weights(); !reflect.DeepEqual(got, map[string]int{"primary": 95, "candidate": 5}) {
		t.Errorf("a failed SetWeights changed the weights: %v", got)
	}
	// With a route cluster, all-zero weights send unflagged requests there.
	rt = mustNew(t, twoSplits(95, 5), "main", "")
	if err := rt.SetWeights(map[string]int{"primary": 0, "candidate": 0}); err != nil {
		t.Fatal(err)
	}
	if got := rt.Plan(context.Background(), req("s"))[0].Cluster; got != "main" {
		t.Errorf("all-zero weights: plan starts at %q, want main", got)
	}
}

func TestSetWeightsConcurrentWithPlan(t *testing.T) {
	rt := mustNew(t, twoSplits(95, 5), "", "")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			_ = rt.SetWeights(map[string]int{"candidate": i % 50})
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		default:
		}
		if plan := rt.Plan(context.Background(), req(fmt.Sprint(i))); len(plan) == 0 {
			t.Fatal("empty plan during a weight change")
		}
	}
}

func TestPlanOrderAndDedup(t *testing.T) {
	ms := func(d time.Duration) Duration { return Duration(d) }
	s := Spec{
		Splits: []Split{{Cluster: "a", Weight: 1}},
		Fallback: []Step{
			{Cluster: "b", Model: "small", Timeouts: StepTimeouts{TTFT: ms(200 * time.Millisecond)}},
			{Cluster: "a"}, // the split's cluster: skipped
			{Cluster: "c", On: []string{policy.Cond5xx, policy.CondContract}},
			{Cluster: "b"}, // already in the plan: skipped
			{Cluster: "d", Timeouts: StepTimeouts{Idle: ms(time.Second), Total: ms(time.Minute)}},
		},
	}
	rt := mustNew(t, s, "", "route-model")
	plan := rt.Plan(context.Background(), req("s"))
	var clusters []string
	for _, c := range plan {
		clusters = append(clusters, c.Cluster)
	}
	if !slices.Equal(clusters, []string{"a", "b", "c", "d"}) {
		t.Fatalf("plan clusters %v, want [a b c d]", clusters)
	}
	want := []policy.Candidate{
		{Cluster: "a", Model: "route-model", Split: "a"},                                              // moves to b on the defaults
		{Cluster: "b", Model: "small", TTFT: 200 * time.Millisecond, On: []string{"5xx", "contract"}}, // c's own
		{Cluster: "c"}, // d: defaults
		{Cluster: "d", Idle: time.Second, Total: time.Minute},
	}
	if !reflect.DeepEqual(plan, want) {
		t.Errorf("plan\n got %+v\nwant %+v", plan, want)
	}
	if cap(plan) != len(plan) {
		t.Errorf("plan has spare capacity: an append by the caller would write into the shared plan")
	}
	// Moves: defaults and custom.
	if !Moves(plan[0], policy.Cond429) || !Moves(plan[0], policy.CondContract) || Moves(plan[0], policy.CondStreamCut) {
		t.Error("default On: 429 and contract should move, stream_cut (without resume) should not")
	}
	if !Moves(plan[1], policy.CondContract) || Moves(plan[1], policy.Cond429) {
		t.Error("custom On: contract should move, 429 should not")
	}
}

func TestPlanNoSplits(t *testing.T) {
	rt := mustNew(t, Spec{Fallback: []Step{{Cluster: "main"}, {Cluster: "fb"}}}, "main", "m")
	plan := rt.Plan(context.Background(), nil)
	if len(plan) != 2 || plan[0].Cluster != "main" || plan[0].Model != "m" || plan[0].Split != "" || plan[1].Cluster != "fb" {
		t.Errorf("plan %+v", plan)
	}
	if _, err := New(Spec{}, "", "", nil); err == nil {
		t.Error("a route with neither cluster nor splits was accepted")
	}
}

func TestResumeAddsStreamCut(t *testing.T) {
	rt := mustNew(t, Spec{Resume: true, Fallback: []Step{{Cluster: "fb"}, {Cluster: "fb2", On: []string{"5xx"}}}}, "main", "")
	plan := rt.Plan(context.Background(), req(""))
	if !Moves(plan[0], policy.CondStreamCut) || !Moves(plan[0], policy.CondConnect) {
		t.Errorf("resume: default On %v lacks stream_cut or connect", plan[0].On)
	}
	if Moves(plan[1], policy.CondStreamCut) {
		t.Errorf("a step's explicit on (5xx) must not gain stream_cut: %v", plan[1].On)
	}
	if !rt.Resume() {
		t.Error("Resume() = false")
	}
}

func TestPlanAllocatesNothing(t *testing.T) {
	rt := mustNew(t, benchSpec(), "", "")
	r := req("session-42")
	r.Header.Set("Authorization", "Bearer sk-test")
	if a := testing.AllocsPerRun(1000, func() { rt.Plan(context.Background(), r) }); a != 0 {
		t.Errorf("Plan allocates %.1f times per call", a)
	}
	r = req("")
	if a := testing.AllocsPerRun(1000, func() { rt.Plan(context.Background(), r) }); a != 0 {
		t.Errorf("Plan without a key allocates %.1f times per call", a)
	}
}

func TestInherit(t *testing.T) {
	clock := newClock()
	s := Spec{
		Splits:   []Split{{Cluster: "a", Weight: 1}},
		Fallback: []Step{{Cluster: "b"}},
		Breaker:  Breaker{MinRequests: 2, FailureRatio: 0.5, OpenFor: Duration(time.Hour)},
	}
	old, err := New(s, "", "", clock)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		done, ok := old.Breakers().Allow("a")
		if !ok {
			t.Fatal("closed breaker refused")
		}
		done.End(true, false)
	}
	if st := old.Breakers().State("a"); st != "open" {
		t.Fatalf("breaker a %s, want open", st)
	}
	for range 10 {
		old.Budgets().RecordRequest()
		old.Budgets().RecordSend("a")
	}
	old.Budgets().TryRetry("a")

	// Same breaker config, new weights and budget: the breaker of a and the budget carry over.
	s2 := s
	s2.Splits = []Split{{Cluster: "a", Weight: 3}, {Cluster: "c", Weight: 1}}
	s2.Retry.Budget = f64(0.5)
	nw, err := New(s2, "", "", clock)
	if err != nil {
		t.Fatal(err)
	}
	nw.Inherit(old)
	if st := nw.Breakers().State("a"); st != "open" {
		t.Errorf("inherited breaker a %s, want open", st)
	}
	if st := nw.Breakers().State("c"); st != "closed" {
		t.Errorf("new cluster c's breaker %s, want closed", st)
	}
	bs := nw.Budgets().Status()
	if bs.Requests != 10 || bs.Clusters[0].Retries != 1 || bs.Retry.Ratio != 0.5 || bs.Fallback.Ratio != DefaultFallbackBudget {
		t.Errorf("inherited budget %+v, want 10 requests, 1 retry on a, ratio 0.5", bs)
	}
	if nw.Budgets() != old.Budgets() {
		t.Error("the old Router's in-flight requests and the new one must share the budget")
	}

	// A changed breaker config starts afresh.
	s3 := s2
	s3.Breaker.MinRequests = 5
	fresh, _ := New(s3, "", "", clock)
	fresh.Inherit(nw)
	if st := fresh.Breakers().State("a"); st != "closed" {
		t.Errorf("breaker with a changed config %s, want a fresh closed one", st)
	}
	fresh.Inherit(nil) // no-op
}

func TestSnapshot(t *testing.T) {
	rt := mustNew(t, twoSplits(95, 5), "", "")
	st := rt.Snapshot()
	if len(st.Splits) != 2 || st.Splits[1].Weight != 5 || len(st.Breakers) != 2 || st.Budget.Window != BudgetWindow {
		t.Errorf("snapshot %+v", st)
	}
	if got := rt.Clusters(); !slices.Equal(got, []string{"primary", "candidate"}) {
		t.Errorf("Clusters() = %v", got)
	}
}
