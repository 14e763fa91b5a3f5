package load

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

func TestMeasureSingleTokenEvents(t *testing.T) {
	ev := []Event{{At: 5 * ms, Usage: -1}, // role chunk, no content
		{At: 20 * ms, Content: true, Tokens: 1, Usage: -1},
		{At: 30 * ms, Content: true, Tokens: 1, Usage: -1},
		{At: 45 * ms, Content: true, Tokens: 1, Usage: -1},
		{At: 46 * ms, Usage: -1}} // finish chunk
	tl := Measure(ev, 3)
	if tl.FirstEvent != 5*ms || tl.TTFT != 20*ms || tl.E2E != 45*ms || tl.Tokens != 3 || !tl.FromUsage {
		t.Fatalf("%+v", tl)
	}
	if !reflect.DeepEqual(tl.ITL, []time.Duration{10 * ms, 15 * ms}) || tl.TPOT != 12500*time.Microsecond {
		t.Fatalf("itl %v tpot %v", tl.ITL, tl.TPOT)
	}
}

func TestMeasureSplitsMultiTokenEvents(t *testing.T) {
	// Tokenizer says 2 then 4 tokens per event; usage says 9 in all: scaled to 3 and 6.
	ev := []Event{{At: 10 * ms, Content: true, Tokens: 2, Usage: -1}, {At: 40 * ms, Content: true, Tokens: 4, Usage: -1}}
	tl := Measure(ev, 9)
	want := []time.Duration{10 * ms, 10 * ms, 10 * ms, 15 * ms, 20 * ms, 25 * ms, 30 * ms, 35 * ms, 40 * ms}
	if !reflect.DeepEqual(tl.TokenTimes, want) {
		t.Fatalf("token times %v", tl.TokenTimes)
	}
	if tl.Tokens != 9 || tl.TTFT != 10*ms || tl.E2E != 40*ms || tl.TPOT != 30*ms/8 || len(tl.ITL) != 8 {
		t.Fatalf("%+v", tl)
	}
	// Without usage the tokenizer counts stand, labelled as estimates.
	tl = Measure(ev, -1)
	if tl.Tokens != 6 || tl.FromUsage {
		t.Fatalf("%+v", tl)
	}
}

func TestMeasureContinuousUsage(t *testing.T) {
	ev := []Event{{At: 10 * ms, Content: true, Tokens: 1, Usage: 2}, {At: 20 * ms, Content: true, Tokens: 1, Usage: 2},
		{At: 30 * ms, Content: true, Tokens: 1, Usage: 5}}
	tl := Measure(ev, -1)
	// 2 at 10ms, the zero-delta event is dropped, 3 split over 10..30.
	want := []time.Duration{10 * ms, 10 * ms, 10*ms + 20*ms/3, 10*ms + 40*ms/3, 30 * ms}
	if !reflect.DeepEqual(tl.TokenTimes, want) || !tl.FromUsage {
		t.Fatalf("%v", tl.TokenTimes)
	}
}

func TestMeasureEmptyAndNonStream(t *testing.T) {
	tl := Measure(nil, -1)
	if tl.TTFT != -1 || tl.Tokens != 0 || tl.TPOT != -1 {
		t.Fatalf("%+v", tl)
	}
	tl = Measure([]Event{{At: 80 * ms, Content: true, Tokens: 7, Usage: -1}}, 12)
	if tl.TTFT != 80*ms || tl.E2E != 80*ms || tl.Tokens != 12 || tl.TPOT != 0 {
		t.Fatalf("%+v", tl)
	}
}

func TestApportion(t *testing.T) {
	for _, c := range []struct {
		w     []int
		total int
	}{{[]int{1, 1, 1}, 7}, {[]int{5, 1}, 3}, {[]int{2, 2, 2, 2}, 1}, {[]int{3}, 0}} {
		got := apportion(c.w, c.total)
		sum := 0
		for _, g := range got {
			if g < 0 {
				t.Fatalf("%v", got)
			}
			sum += g
		}
		if sum != c.total {
			t.Fatalf("apportion(%v, %d) = %v", c.w, c.total, got)
		}
	}
}

func result(i int, sent time.Time, ttft, itl time.Duration, n int, class string) *Result {
	ev := []Event{}
	for k := range n {
		ev = append(ev, Event{At: ttft + time.Duration(k)*itl, Content: true, Tokens: 1, Usage: -1})
	}
	r := &Result{Index: i, Scheduled: sent.Add(-time.Duration(i%7) * time.Microsecond), Sent: sent, Class: class, Status: 200,
		Timeline: Measure(ev, n), Input: 100}
	if class != ErrNone {
		r.Status, r.Timeline = 503, Measure(nil, -1)
	}
	r.Done = sent.Add(ttft + time.Duration(n)*itl)
	if i%5 == 0 {
		r.Attempts, r.Upstream = 2, "fallback"
	}
	return r
}

func TestMergeHalvesEqualsWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Unix(1_700_000_000, 0)
	slo := SLO{TTFT: 60 * ms, ITL: 12 * ms}
	whole, a, b := NewCollector(slo), NewCollector(slo), NewCollector(slo)
	for i := range 400 {
		class := ErrNone
		if i%13 == 0 {
			class = ErrHTTP5xx
		}
		r := result(i, base.Add(time.Duration(rng.IntN(5000))*ms), time.Duration(20+rng.IntN(80))*ms,
			time.Duration(5+rng.IntN(10))*ms, 1+rng.IntN(50), class)
		whole.Add(r)
		if i%2 == 0 {
			a.Add(r)
		} else {
			b.Add(r)
		}
	}
	m, err := Merge(roundTrip(t, a.Report()), roundTrip(t, b.Report()))
	if err != nil {
		t.Fatal(err)
	}
	w := whole.Report()
	var jw, jm bytes.Buffer
	if err := w.WriteJSON(&jw); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteJSON(&jm); err != nil {
		t.Fatal(err)
	}
	if jw.String() != jm.String() {
		t.Fatalf("merged differs from whole:\n%s\n---\n%s", jm.String()[:2000], jw.String()[:2000])
	}
	if w.Requests != 400 || w.Retried != 80 || w.Summary.Attainment == nil {
		t.Fatalf("%+v", w.Summary)
	}
}

func roundTrip(t *testing.T, r *Report) *Report {
	t.Helper()
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	out, err := ReadReport(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func gapStats(p Pacer, n int) (mean, cv float64) {
	var prev time.Duration
	var xs []float64
	for range n {
		at, _ := p.Next()
		xs = append(xs, (at - prev).Seconds())
		prev = at
	}
	var s, s2 float64
	for _, x := range xs {
		s += x
	}
	mean = s / float64(n)
	for _, x := range xs {
		s2 += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(s2/float64(n)) / mean
}

func TestPacerGaps(t *testing.T) {
	const n = 50000
	for _, c := range []struct {
		arrival string
		b, cv   float64
	}{{ArrivalPoisson, 0, 1}, {ArrivalGamma, 1, 1}, {ArrivalGamma, 0.25, 2}, {ArrivalGamma, 4, 0.5}, {ArrivalConstant, 0, 0}} {
		mean, cv := gapStats(NewRatePacer(50, c.arrival, c.b, 7), n)
		if math.Abs(mean-0.02)/0.02 > 0.03 {
			t.Errorf("%s b=%g: mean gap %.5f, want 0.02", c.arrival, c.b, mean)
		}
		if math.Abs(cv-c.cv) > 0.05*math.Max(c.cv, 1) {
			t.Errorf("%s b=%g: CV %.3f, want %.2f (1/sqrt(shape))", c.arrival, c.b, cv, c.cv)
		}
	}
}

func TestRampPacer(t *testing.T) {
	p := NewRatePacer(10, ArrivalConstant, 0, 1)
	p.RampTo, p.RampOver = 30, 10*time.Second
	count := 0
	for {
		at, _ := p.Next()
		if at > 10*time.Second {
			break
		}
		count++
	}
	// ∫ rate = (10+30)/2 × 10 = 200 arrivals.
	if count < 199 || count > 201 {
		t.Fatalf("ramp sent %d in 10s, want 200", count)
	}
}

func TestTracePacerScale(t *testing.T) {
	p := &TracePacer{Items: []Item{{At: 0}, {At: time.Second}, {At: 3 * time.Second}}, Scale: 0.5}
	var got []time.Duration
	for {
		at, ok := p.Next()
		if !ok {
			break
		}
		got = append(got, at)
	}
	if !reflect.DeepEqual(got, []time.Duration{0, 500 * ms, 1500 * ms}) {
		t.Fatal(got)
	}
}

func TestSynthExactTokens(t *testing.T) {
	s, err := NewSynth()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 7, 511, 512, 513, 2000} {
		if got := CountTokens(s.Text(n, nil, uint64(n))); got != n {
			t.Errorf("Text(%d) has %d tokens", n, got)
		}
		if got := CountTokens(s.Marked(n+10, "[[mem:abc-1-2]]", 3)); got != n+10 {
			t.Errorf("Marked(%d) has %d tokens", n+10, got)
		}
	}
	// Shared hash ids share text exactly; different ids differ.
	a := s.Text(1100, []int64{1, 2, 3}, 9)
	b := s.Text(1500, []int64{1, 2, 4}, 10)
	if a[:len(s.Text(1024, []int64{1, 2}, 0))] != b[:len(s.Text(1024, []int64{1, 2}, 0))] {
		t.Error("shared prefix blocks differ")
	}
	if CountTokens(a) != 1100 || CountTokens(b) != 1500 {
		t.Error("hash-id prompt token counts")
	}
	if p := Perturb(a, 0.3, rand.New(rand.NewPCG(1, 1))); p == a || CountTokens(p) != 1100 {
		t.Error("perturb must change words and keep the count")
	}
}

func TestParseTraceFiles(t *testing.T) {
	for _, c := range []struct {
		file, format string
		n            int
	}{{"azure_conv_200.csv", FormatAzure, 200}, {"mooncake_conversation_200.jsonl", FormatMooncake, 200}, {"sharegpt_small.json", FormatShareGPT, 2}} {
		w, err := LoadTrace("testdata/" + c.file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(w.Name, c.format) || len(w.Items) != c.n {
			t.Fatalf("%s: %s, %d items", c.file, w.Name, len(w.Items))
		}
		for i := 1; i < len(w.Items); i++ {
			if w.Items[i].At < w.Items[i-1].At {
				t.Fatalf("%s: unsorted at %d", c.file, i)
			}
		}
	}
	w, _ := LoadTrace("testdata/mooncake_conversation_200.jsonl")
	if len(w.Items[0].HashIDs) == 0 || w.Items[0].InputTokens == 0 {
		t.Fatalf("%+v", w.Items[0])
	}
	w, _ = LoadTrace("testdata/azure_conv_200.csv")
	if w.Items[0].At != 0 || w.Items[199].At <= 0 {
		t.Fatal("azure timestamps")
	}
}

func TestParseSpecs(t *testing.T) {
	sp, err := ParseSynthetic("in=lognormal:1000:0.5,out=fixed:128")
	if err != nil || sp.In.Kind != "lognormal" || sp.Out.A != 128 {
		t.Fatal(sp, err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for range 1000 {
		if v := (Dist{Kind: "uniform", A: 5, B: 9}).Draw(rng); v < 5 || v > 9 {
			t.Fatal(v)
		}
	}
	for _, bad := range []string{"in=foo:1", "in=uniform:9:1", "x=1", "in", "in=normal:1"} {
		if _, err := ParseSynthetic(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	ss, err := ParseSessions("n=3,turns=2,think=gamma:2:10ms")
	if err != nil || ss.Sessions != 3 || ss.ThinkScale != 10*ms {
		t.Fatal(ss, err)
	}
	slo, err := ParseSLO("ttft=500ms,itl=50ms")
	if err != nil || slo.TTFT != 500*ms || slo.ITL != 50*ms {
		t.Fatal(slo, err)
	}
}

func FuzzParseTrace(f *testing.F) {
	for _, p := range []string{"testdata/azure_conv_200.csv", "testdata/mooncake_conversation_200.jsonl", "testdata/sharegpt_small.json"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), 2000)])
	}
	f.Add([]byte(`{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [1]}`))
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := ParseTrace(bytes.NewReader(b))
		if err != nil {
			return
		}
		if len(w.Items) == 0 {
			t.Fatal("no error and no items")
		}
		for _, it := range w.Items {
			if it.OutputTokens < 1 || it.At < 0 {
				t.Fatalf("%+v", it)
			}
		}
	})
}

func TestHTMLSelfContained(t *testing.T) {
	c := NewCollector(SLO{TTFT: 50 * ms})
	base := time.Unix(1_700_000_000, 0)
	for i := range 50 {
		c.Add(result(i, base.Add(time.Duration(i)*100*ms), time.Duration(20+i)*ms, 5*ms, 10, ErrNone))
	}
	r := c.Report()
	r.Sweep = []SweepStep{{Rate: 1, Attainment: 1, Pass: true}, {Rate: 2, Attainment: 0.5}}
	var buf bytes.Buffer
	if err := r.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	h := buf.String()
	for _, want := range []string{"<svg", "TTFT distribution", "Output tokens per second", "SLO attainment vs rate", "Errors and faults"} {
		if !strings.Contains(h, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	h = strings.ReplaceAll(h, `xmlns="http://www.w3.org/2000/svg"`, "")
	for _, bad := range []string{"<script", "<link", "http://", "https://", "url("} {
		if strings.Contains(h, bad) {
			t.Errorf("report references %q", bad)
		}
	}
}
