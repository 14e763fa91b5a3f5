package load

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram names in a Report.
const (
	HTTFT       = "ttft"
	HTPOT       = "tpot"
	HITL        = "itl"
	HE2E        = "e2e"
	HFirstEvent = "first_event"
	HLag        = "lag"
)

var histNames = []string{HTTFT, HTPOT, HITL, HE2E, HFirstEvent, HLag}

// Hist is an HDR histogram of microseconds (1 µs .. 1 h, 3 significant digits) that
// encodes to JSON as a base64 V2-compressed HdrHistogram blob.
type Hist struct{ h *hdr.Histogram }

func newHist() *Hist { return &Hist{h: hdr.New(1, int64(time.Hour/time.Microsecond), 3)} }

// Record adds d (clamped to the range).
func (h *Hist) Record(d time.Duration) {
	us := max(min(int64(d/time.Microsecond), h.h.HighestTrackableValue()), 0)
	_ = h.h.RecordValue(us)
}

// Count is the number of values.
func (h *Hist) Count() int64 { return h.h.TotalCount() }

// Quantile returns the value at q (0..100) as a duration.
func (h *Hist) Quantile(q float64) time.Duration {
	return time.Duration(h.h.ValueAtPercentile(q)) * time.Microsecond
}

// Merge adds o's counts.
func (h *Hist) Merge(o *Hist) { h.h.Merge(o.h) }

// Bars returns (value µs, count) pairs of the non-empty buckets.
func (h *Hist) Bars() []hdr.Bar {
	var out []hdr.Bar
	for _, b := range h.h.Distribution() {
		if b.Count > 0 {
			out = append(out, b)
		}
	}
	return out
}

func (h *Hist) MarshalJSON() ([]byte, error) {
	b, err := h.h.Encode(hdr.V2CompressedEncodingCookieBase)
	if err != nil {
		return nil, err
	}
	return json.Marshal(base64.StdEncoding.EncodeToString(b))
}

func (h *Hist) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	d, err := hdr.Decode(raw)
	if err != nil {
		return err
	}
	h.h = newHist().h
	if dropped := h.h.Merge(d); dropped > 0 {
		return fmt.Errorf("histogram: %d values out of range", dropped)
	}
	return nil
}

// SLO limits; zero means no limit.
type SLO struct {
	TTFT time.Duration `json:"ttft,omitempty"`
	TPOT time.Duration `json:"tpot,omitempty"`
	ITL  time.Duration `json:"itl,omitempty"` // every gap of the request
	E2E  time.Duration `json:"e2e,omitempty"`
}

// Any reports whether a limit is set.
func (s SLO) Any() bool { return s.TTFT > 0 || s.TPOT > 0 || s.ITL > 0 || s.E2E > 0 }

// ParseSLO parses "ttft=500ms,itl=50ms,tpot=40ms,e2e=10s".
func ParseSLO(s string) (SLO, error) {
	var o SLO
	kv, err := parseKV(s)
	if err != nil {
		return o, err
	}
	for k, v := range kv {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("slo %s=%q: want a positive duration", k, v)
		}
		switch strings.ToLower(k) {
		case "ttft":
			o.TTFT = d
		case "tpot":
			o.TPOT = d
		case "itl":
			o.ITL = d
		case "e2e", "e2el":
			o.E2E = d
		default:
			return o, fmt.Errorf("slo: unknown metric %q (want ttft, tpot, itl, e2e)", k)
		}
	}
	return o, nil
}

// Bucket is one wall-clock second of a run.
type Bucket struct {
	Unix    int64 `json:"unix"`
	Sent    int64 `json:"sent"`
	Done    int64 `json:"done"`
	Errors  int64 `json:"errors"`
	Tokens  int64 `json:"tokens"`   // output tokens whose (split) time falls in this second
	TTFTSum int64 `json:"ttft_sum"` // µs, requests sent in this second
	TTFTN   int64 `json:"ttft_n"`
	TTFTMax int64 `json:"ttft_max"` // µs
}

// SweepStep is one rate tried by a sweep.
type SweepStep struct {
	Rate       float64 `json:"rate"`
	Requests   int64   `json:"requests"`
	Attainment float64 `json:"attainment"` // share meeting every SLO
	Goodput    float64 `json:"goodput"`
	Throughput float64 `json:"throughput"` // completed req/s
	TTFTp50    float64 `json:"ttft_p50_ms"`
	TTFTp99    float64 `json:"ttft_p99_ms"`
	ITLp99     float64 `json:"itl_p99_ms"`
	LagP99     float64 `json:"lag_p99_ms"`
	Pass       bool    `json:"pass"`
}

// Meta describes a run.
type Meta struct {
	Target   string   `json:"target"`
	Model    string   `json:"model,omitempty"`
	Workload string   `json:"workload"`
	Load     string   `json:"load"`
	Shards   []string `json:"shards,omitempty"` // "i/n" of each merged shard
	Started  string   `json:"started"`
	Tool     string   `json:"tool"`
}

// ErrorSample is one error message kept as an example.
type ErrorSample struct {
	Class   string `json:"class"`
	Status  int    `json:"status,omitempty"`
	Message string `json:"message"`
	Count   int64  `json:"count"`
}

// Report is the raw, mergeable result of a run (Summary is derived).
type Report struct {
	Version         int              `json:"version"`
	Meta            Meta             `json:"meta"`
	Requests        int64            `json:"requests"`
	OK              int64            `json:"ok"`
	Failed          int64            `json:"failed"`
	Aborted         int64            `json:"aborted"`
	InputTokens     int64            `json:"input_tokens"`
	OutputTokens    int64            `json:"output_tokens"`
	TokensFromUsage int64            `json:"tokens_from_usage"` // requests whose count came from usage
	TokensEstimated int64            `json:"tokens_estimated"`  // requests counted with the tokenizer
	Retried         int64            `json:"retried"`           // x-sluice-attempts > 1
	Recovered       int64            `json:"recovered"`         // ... and succeeded
	SLO             SLO              `json:"slo"`
	SLOMet          map[string]int64 `json:"slo_met"` // per metric and "all", of non-aborted requests
	Errors          map[string]int64 `json:"errors"`
	Statuses        map[string]int64 `json:"statuses"`
	Upstreams       map[string]int64 `json:"upstreams"`
	MarkersExpected int64            `json:"markers_expected"`
	MarkersFound    int64            `json:"markers_found"`
	FirstSend       int64            `json:"first_send_unix_ns"`
	LastDone        int64            `json:"last_done_unix_ns"`
	Hist            map[string]*Hist `json:"histograms"`
	Seconds         []Bucket         `json:"seconds"`
	Samples         []ErrorSample    `json:"error_samples,omitempty"`
	Sweep           []SweepStep      `json:"sweep,omitempty"`
	Summary         *Summary         `json:"summary"`
}

// ReportVersion is the JSON format version.
const ReportVersion = 1

// NewReport returns an empty report.
func NewReport() *Report {
	r := &Report{Version: ReportVersion, SLOMet: map[string]int64{}, Errors: map[string]int64{},
		Statuses: map[string]int64{}, Upstreams: map[string]int64{}, Hist: map[string]*Hist{}}
	for _, n := range histNames {
		r.Hist[n] = newHist()
	}
	return r
}

const maxSamples = 20

// Collector accumulates Results into a Report; safe for concurrent use.
type Collector struct {
	mu      sync.Mutex
	r       *Report
	secs    map[int64]*Bucket
	samples map[string]*ErrorSample
	order   []string
}

// NewCollector returns a collector for slo.
func NewCollector(slo SLO) *Collector {
	r := NewReport()
	r.SLO = slo
	return &Collector{r: r, secs: map[int64]*Bucket{}, samples: map[string]*ErrorSample{}}
}

func (c *Collector) sec(t time.Time) *Bucket {
	u := t.Unix()
	b := c.secs[u]
	if b == nil {
		b = &Bucket{Unix: u}
		c.secs[u] = b
	}
	return b
}

// Add records one result.
func (c *Collector) Add(res *Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.r
	r.Requests++
	r.InputTokens += int64(res.Input)
	if r.FirstSend == 0 || res.Sent.UnixNano() < r.FirstSend {
		r.FirstSend = res.Sent.UnixNano()
	}
	if res.Done.UnixNano() > r.LastDone {
		r.LastDone = res.Done.UnixNano()
	}
	if !res.Scheduled.IsZero() {
		r.Hist[HLag].Record(res.Lag())
	}
	if res.Status != 0 {
		r.Statuses[fmt.Sprint(res.Status)]++
	}
	if res.Upstream != "" {
		r.Upstreams[res.Upstream]++
	}
	if res.Attempts > 1 {
		r.Retried++
		if res.OK() {
			r.Recovered++
		}
	}
	r.MarkersExpected += int64(res.Expected)
	r.MarkersFound += int64(res.Found)
	c.sec(res.Sent).Sent++
	done := c.sec(res.Done)
	done.Done++
	if res.FirstEvent >= 0 {
		r.Hist[HFirstEvent].Record(res.FirstEvent)
	}
	if res.TTFT >= 0 {
		r.Hist[HTTFT].Record(res.TTFT)
		b := c.sec(res.Sent)
		us := res.TTFT.Microseconds()
		b.TTFTSum += us
		b.TTFTN++
		b.TTFTMax = max(b.TTFTMax, us)
	}
	r.OutputTokens += int64(res.Tokens)
	if res.Tokens > 0 {
		if res.FromUsage {
			r.TokensFromUsage++
		} else {
			r.TokensEstimated++
		}
	}
	for _, t := range res.TokenTimes {
		c.sec(res.Sent.Add(t)).Tokens++
	}
	for _, g := range res.ITL {
		r.Hist[HITL].Record(g)
	}
	switch {
	case res.Aborted:
		r.Aborted++
		return
	case res.Class != ErrNone:
		r.Failed++
		r.Errors[res.Class]++
		done.Errors++
		key := res.Class + "\x00" + fmt.Sprint(res.Status) + "\x00" + res.Err
		if s := c.samples[key]; s != nil {
			s.Count++
		} else if len(c.samples) < maxSamples {
			c.samples[key] = &ErrorSample{Class: res.Class, Status: res.Status, Message: res.Err, Count: 1}
			c.order = append(c.order, key)
		}
		return
	}
	r.OK++
	r.Hist[HE2E].Record(res.E2E)
	if res.TPOT >= 0 {
		r.Hist[HTPOT].Record(res.TPOT)
	}
	s := r.SLO
	okT := s.TTFT == 0 || (res.TTFT >= 0 && res.TTFT <= s.TTFT)
	okP := s.TPOT == 0 || res.TPOT <= s.TPOT // -1 (one token) passes
	okI := true
	if s.ITL > 0 {
		for _, g := range res.ITL {
			if g > s.ITL {
				okI = false
				break
			}
		}
	}
	okE := s.E2E == 0 || res.E2E <= s.E2E
	for k, ok := range map[string]bool{"ttft": okT, "tpot": okP, "itl": okI, "e2e": okE, "all": okT && okP && okI && okE} {
		if ok {
			r.SLOMet[k]++
		}
	}
}

// Snapshot returns a summarised copy of the report so far (for live views and the end).
func (c *Collector) Report() *Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.r.clone()
	out.Seconds = nil
	for _, u := range slices.Sorted(maps.Keys(c.secs)) {
		out.Seconds = append(out.Seconds, *c.secs[u])
	}
	out.Samples = nil
	for _, k := range c.order {
		out.Samples = append(out.Samples, *c.samples[k])
	}
	out.Summarize()
	return out
}

// Live returns counts and TTFT percentiles cheaply for the live view.
func (c *Collector) Live() (done, errs int64, p50, p99 time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.r.Hist[HTTFT]
	return c.r.Requests, c.r.Failed, h.Quantile(50), h.Quantile(99)
}

func (r *Report) clone() *Report {
	o := *r
	o.SLOMet, o.Errors, o.Statuses, o.Upstreams = maps.Clone(r.SLOMet), maps.Clone(r.Errors), maps.Clone(r.Statuses), maps.Clone(r.Upstreams)
	o.Hist = map[string]*Hist{}
	for k, h := range r.Hist {
		o.Hist[k] = &Hist{h: h.h.Clone()}
	}
	o.Seconds = slices.Clone(r.Seconds)
	o.Samples = slices.Clone(r.Samples)
	o.Sweep = slices.Clone(r.Sweep)
	o.Meta.Shards = slices.Clone(r.Meta.Shards)
	return &o
}

// Pct is a set of percentiles in milliseconds.
type Pct struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p99_9_ms"`
	Max   float64 `json:"max_ms"`
}

// Summary is derived from a Report's raw data.
type Summary struct {
	DurationS       float64            `json:"duration_s"` // first send to last completion
	ReqPerS         float64            `json:"req_per_s"`  // completed (ok) requests per second
	OutTokPerS      float64            `json:"output_tok_per_s"`
	InTokPerS       float64            `json:"input_tok_per_s"`
	Goodput         float64            `json:"goodput_req_per_s,omitempty"`
	Attainment      map[string]float64 `json:"slo_attainment,omitempty"`
	ErrorRate       float64            `json:"error_rate"`
	RecoveryRate    float64            `json:"recovery_rate"` // recovered / ok
	ContextFidelity float64            `json:"context_fidelity,omitempty"`
	Latency         map[string]Pct     `json:"latency"`
}

// Summarize (re)computes r.Summary.
func (r *Report) Summarize() {
	s := &Summary{Latency: map[string]Pct{}}
	if r.LastDone > r.FirstSend && r.FirstSend > 0 {
		s.DurationS = float64(r.LastDone-r.FirstSend) / 1e9
	}
	if s.DurationS > 0 {
		s.ReqPerS = float64(r.OK) / s.DurationS
		s.OutTokPerS = float64(r.OutputTokens) / s.DurationS
		s.InTokPerS = float64(r.InputTokens) / s.DurationS
	}
	measured := r.Requests - r.Aborted
	if r.SLO.Any() && measured > 0 {
		s.Attainment = map[string]float64{}
		for _, k := range []string{"ttft", "tpot", "itl", "e2e", "all"} {
			s.Attainment[k] = float64(r.SLOMet[k]) / float64(measured)
		}
		if s.DurationS > 0 {
			s.Goodput = float64(r.SLOMet["all"]) / s.DurationS
		}
	}
	if measured > 0 {
		s.ErrorRate = float64(r.Failed) / float64(measured)
	}
	if r.OK > 0 {
		s.RecoveryRate = float64(r.Recovered) / float64(r.OK)
	}
	if r.MarkersExpected > 0 {
		s.ContextFidelity = float64(r.MarkersFound) / float64(r.MarkersExpected)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, n := range histNames {
		h := r.Hist[n]
		if h == nil || h.Count() == 0 {
			continue
		}
		s.Latency[n] = Pct{Count: h.Count(), Mean: h.h.Mean() / 1000, P50: ms(h.Quantile(50)), P90: ms(h.Quantile(90)),
			P95: ms(h.Quantile(95)), P99: ms(h.Quantile(99)), P999: ms(h.Quantile(99.9)), Max: float64(h.h.Max()) / 1000}
	}
	r.Summary = s
}

// DefaultAttainment is the share of requests that must meet every SLO for a run (and a
// sweep step) to pass, when none is given.
const DefaultAttainment = 0.9

// Errors of Check, for errors.Is.
var (
	ErrAllFailed = errors.New("every request failed")
	ErrSLOMissed = errors.New("SLO missed")
)

// Check judges the run as a CI gate would (k6's thresholds), returning nil when it passed:
// ErrAllFailed when requests were measured (not aborted by client-side chaos) and none
// succeeded; ErrSLOMissed when an SLO is set and the share of measured requests meeting every
// limit (failed requests meet none) is below minAttainment (0 disables this check). A sweep's
// report (Sweep set) passes when one of its steps passed. A run that measured nothing (no
// request sent, or every one aborted on purpose) passes. The message says why, with counts.
func (r *Report) Check(minAttainment float64) error {
	if r.Summary == nil {
		r.Summarize()
	}
	measured := r.Requests - r.Aborted
	if measured > 0 && r.OK == 0 {
		return fmt.Errorf("%w (%d of %d: %s)", ErrAllFailed, r.Failed, measured, formatCounts(r.Errors))
	}
	if len(r.Sweep) > 0 {
		best := r.Sweep[0]
		for _, st := range r.Sweep {
			if st.Pass {
				return nil
			}
			if st.Attainment > best.Attainment {
				best = st
			}
		}
		d := decimals(best.Attainment, minAttainment)
		return fmt.Errorf("%w at every rate of the sweep (%d steps): best attainment %.*f%% < %.*f%%, at %.2f req/s",
			ErrSLOMissed, len(r.Sweep), d, 100*best.Attainment, d, 100*minAttainment, best.Rate)
	}
	att, ok := r.Summary.Attainment["all"]
	if !ok || minAttainment <= 0 || att >= minAttainment {
		return nil
	}
	d := decimals(att, minAttainment)
	var per []string
	for _, m := range []struct {
		name string
		set  bool
	}{{"ttft", r.SLO.TTFT > 0}, {"tpot", r.SLO.TPOT > 0}, {"itl", r.SLO.ITL > 0}, {"e2e", r.SLO.E2E > 0}} {
		if m.set {
			per = append(per, fmt.Sprintf("%s %.*f%%", m.name, d, 100*r.Summary.Attainment[m.name]))
		}
	}
	return fmt.Errorf("%w: attainment %.*f%% < %.*f%% (%s; %d of %d requests met every limit)", ErrSLOMissed,
		d, 100*att, d, 100*minAttainment, strings.Join(per, ", "), r.SLOMet["all"], measured)
}

// decimals is how many decimals two shares need as percentages to print differently (one
// at least, four at most): 0.8996 against 0.9 is "89.96% < 90.00%", not "90.0% < 90.0%".
func decimals(got, want float64) int {
	d := 1
	for d < 4 && fmt.Sprintf("%.*f", d, 100*got) == fmt.Sprintf("%.*f", d, 100*want) {
		d++
	}
	return d
}

// Merge combines shard reports exactly: counts and histograms add, buckets add by second,
// the span runs from the earliest send to the latest completion.
func Merge(reports ...*Report) (*Report, error) {
	if len(reports) == 0 {
		return nil, errors.New("merge: no reports")
	}
	out := NewReport()
	out.Meta = reports[0].Meta
	out.Meta.Shards = nil
	out.SLO = reports[0].SLO
	secs := map[int64]*Bucket{}
	samples := map[string]int{}
	for i, r := range reports {
		if r.Version != ReportVersion {
			return nil, fmt.Errorf("merge: report %d has version %d, want %d", i+1, r.Version, ReportVersion)
		}
		if r.SLO != out.SLO {
			return nil, fmt.Errorf("merge: report %d has a different SLO", i+1)
		}
		if len(r.Meta.Shards) > 0 {
			out.Meta.Shards = append(out.Meta.Shards, r.Meta.Shards...)
		}
		out.Requests += r.Requests
		out.OK += r.OK
		out.Failed += r.Failed
		out.Aborted += r.Aborted
		out.InputTokens += r.InputTokens
		out.OutputTokens += r.OutputTokens
		out.TokensFromUsage += r.TokensFromUsage
		out.TokensEstimated += r.TokensEstimated
		out.Retried += r.Retried
		out.Recovered += r.Recovered
		out.MarkersExpected += r.MarkersExpected
		out.MarkersFound += r.MarkersFound
		for _, p := range []struct{ dst, src map[string]int64 }{{out.SLOMet, r.SLOMet}, {out.Errors, r.Errors},
			{out.Statuses, r.Statuses}, {out.Upstreams, r.Upstreams}} {
			for k, v := range p.src {
				p.dst[k] += v
			}
		}
		if r.FirstSend > 0 && (out.FirstSend == 0 || r.FirstSend < out.FirstSend) {
			out.FirstSend = r.FirstSend
		}
		out.LastDone = max(out.LastDone, r.LastDone)
		for n, h := range r.Hist {
			if out.Hist[n] == nil {
				out.Hist[n] = newHist()
			}
			if h != nil && h.h != nil {
				out.Hist[n].Merge(h)
			}
		}
		for _, b := range r.Seconds {
			o := secs[b.Unix]
			if o == nil {
				o = &Bucket{Unix: b.Unix}
				secs[b.Unix] = o
			}
			o.Sent += b.Sent
			o.Done += b.Done
			o.Errors += b.Errors
			o.Tokens += b.Tokens
			o.TTFTSum += b.TTFTSum
			o.TTFTN += b.TTFTN
			o.TTFTMax = max(o.TTFTMax, b.TTFTMax)
		}
		for _, s := range r.Samples {
			key := s.Class + "\x00" + fmt.Sprint(s.Status) + "\x00" + s.Message
			if j, ok := samples[key]; ok {
				out.Samples[j].Count += s.Count
			} else if len(out.Samples) < maxSamples {
				samples[key] = len(out.Samples)
				out.Samples = append(out.Samples, s)
			}
		}
		if len(out.Sweep) == 0 {
			out.Sweep = slices.Clone(r.Sweep)
		}
	}
	for _, u := range slices.Sorted(maps.Keys(secs)) {
		out.Seconds = append(out.Seconds, *secs[u])
	}
	sort.Strings(out.Meta.Shards)
	out.Summarize()
	return out, nil
}

// WriteJSON writes r (summarised) as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	r.Summarize()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ReadReport reads a JSON report (its Summary is recomputed).
func ReadReport(rd io.Reader) (*Report, error) {
	r := NewReport()
	dec := json.NewDecoder(io.LimitReader(rd, 256<<20))
	if err := dec.Decode(r); err != nil {
		return nil, err
	}
	if r.Version != ReportVersion {
		return nil, fmt.Errorf("report version %d, want %d", r.Version, ReportVersion)
	}
	for _, n := range histNames {
		if r.Hist[n] == nil || r.Hist[n].h == nil {
			r.Hist[n] = newHist()
		}
	}
	for _, m := range []*map[string]int64{&r.SLOMet, &r.Errors, &r.Statuses, &r.Upstreams} {
		if *m == nil {
			*m = map[string]int64{}
		}
	}
	r.Summarize()
	return r, nil
}

// ReadReportFile reads a JSON report from path.
func ReadReportFile(path string) (*Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := ReadReport(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
