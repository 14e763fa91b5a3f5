package load

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"
)

// Item is one request of a workload before its prompt is built.
type Item struct {
	At           time.Duration // arrival offset in the trace (HasAt)
	HasAt        bool
	InputTokens  int     // prompt tokens to synthesise (when Prompt is empty)
	OutputTokens int     // max_tokens (ignore_eos forces it)
	HashIDs      []int64 // Mooncake prefix blocks
	Prompt       string  // literal prompt text (ShareGPT)
	// Body is a recorded request body sent as is (FormatShadow), with its own Stream flag
	// and Endpoint ("chat" or "completions").
	Body     []byte
	Stream   bool
	Endpoint string
}

// Workload is what to send: a parsed trace, a synthetic spec or generated sessions.
type Workload struct {
	Name      string
	Items     []Item         // trace items, in arrival order
	Synthetic *SyntheticSpec // items drawn per index
	Sessions  *SessionSpec   // multi-turn sessions
}

// item returns request i (false when a trace is exhausted). Synthetic items are a pure
// function of (seed, i), so shards agree.
func (w *Workload) item(i int, seed uint64) (Item, bool) {
	switch {
	case w.Synthetic != nil:
		rng := rand.New(rand.NewPCG(seed, uint64(i)*2+1))
		return Item{InputTokens: w.Synthetic.In.Draw(rng), OutputTokens: w.Synthetic.Out.Draw(rng)}, true
	case i < len(w.Items):
		return w.Items[i], true
	}
	return Item{}, false
}

// Dist is a distribution of token counts: fixed:N, uniform:LO:HI, normal:MEAN:SD,
// lognormal:MEDIAN:SIGMA (sigma of the underlying normal). Draws are clamped to [1, 1<<20].
type Dist struct {
	Kind string
	A, B float64
}

// ParseDist parses a Dist; a bare number means fixed.
func ParseDist(s string) (Dist, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	num := func(p string) (float64, error) {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return 0, fmt.Errorf("distribution %q: %q is not a number >= 0", s, p)
		}
		return v, nil
	}
	if len(parts) == 1 {
		v, err := num(parts[0])
		return Dist{Kind: "fixed", A: v}, err
	}
	d := Dist{Kind: parts[0]}
	want := map[string]int{"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}[d.Kind]
	if want == 0 {
		return d, fmt.Errorf("distribution %q: kind must be fixed, uniform, normal or lognormal", s)
	}
	if len(parts)-1 != want {
		return d, fmt.Errorf("distribution %q: %s takes %d parameter(s)", s, d.Kind, want)
	}
	var err error
	if d.A, err = num(parts[1]); err != nil {
		return d, err
	}
	if want == 2 {
		if d.B, err = num(parts[2]); err != nil {
			return d, err
		}
	}
	if d.Kind == "uniform" && d.B < d.A {
		return d, fmt.Errorf("distribution %q: uniform needs LO <= HI", s)
	}
	if d.Kind == "lognormal" && d.A <= 0 {
		return d, fmt.Errorf("distribution %q: lognormal median must be > 0", s)
	}
	return d, nil
}

func (d Dist) String() string {
	if d.Kind == "fixed" {
		return fmt.Sprintf("fixed:%g", d.A)
	}
	return fmt.Sprintf("%s:%g:%g", d.Kind, d.A, d.B)
}

// Draw draws one count.
func (d Dist) Draw(rng *rand.Rand) int {
	var v float64
	switch d.Kind {
	case "uniform":
		v = d.A + rng.Float64()*(d.B-d.A+1)
		v = math.Floor(v)
	case "normal":
		v = math.Round(d.A + rng.NormFloat64()*d.B)
	case "lognormal":
		v = math.Round(d.A * math.Exp(rng.NormFloat64()*d.B))
	default:
		v = math.Round(d.A)
	}
	return int(math.Max(1, math.Min(v, 1<<20)))
}

// SyntheticSpec: in=DIST,out=DIST.
type SyntheticSpec struct{ In, Out Dist }

// ParseSynthetic parses "in=lognormal:1000:0.5,out=fixed:128".
func ParseSynthetic(s string) (*SyntheticSpec, error) {
	sp := &SyntheticSpec{In: Dist{Kind: "fixed", A: 256}, Out: Dist{Kind: "fixed", A: 128}}
	kv, err := parseKV(s)
	if err != nil {
		return nil, err
	}
	for k, v := range kv {
		d, err := ParseDist(v)
		if err != nil {
			return nil, err
		}
		switch k {
		case "in":
			sp.In = d
		case "out":
			sp.Out = d
		default:
			return nil, fmt.Errorf("synthetic spec: unknown key %q (want in, out)", k)
		}
	}
	return sp, nil
}

// SessionSpec describes generated multi-turn sessions.
type SessionSpec struct {
	Sessions   int     // number of sessions (n)
	Turns      int     // turns per session
	In, Out    Dist    // new user tokens per turn, max_tokens per turn
	ThinkShape float64 // Gamma shape of the think time between turns
	ThinkScale time.Duration
}

// ParseSessions parses "n=20,turns=4,in=fixed:200,out=fixed:64,think=gamma:2:500ms".
func ParseSessions(s string) (*SessionSpec, error) {
	sp := &SessionSpec{Sessions: 10, Turns: 4, In: Dist{Kind: "fixed", A: 128}, Out: Dist{Kind: "fixed", A: 64},
		ThinkShape: 2, ThinkScale: 500 * time.Millisecond}
	kv, err := parseKV(s)
	if err != nil {
		return nil, err
	}
	for k, v := range kv {
		switch k {
		case "n", "sessions", "turns":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1_000_000 {
				return nil, fmt.Errorf("sessions spec: %s=%q must be an integer in [1, 1e6]", k, v)
			}
			if k == "turns" {
				sp.Turns = n
			} else {
				sp.Sessions = n
			}
		case "in", "out":
			d, err := ParseDist(v)
			if err != nil {
				return nil, err
			}
			if k == "in" {
				sp.In = d
			} else {
				sp.Out = d
			}
		case "think":
			p := strings.Split(v, ":")
			if len(p) != 3 || p[0] != "gamma" {
				return nil, fmt.Errorf("sessions spec: think=%q must be gamma:SHAPE:SCALE (e.g. gamma:2:500ms)", v)
			}
			sh, err := strconv.ParseFloat(p[1], 64)
			if err != nil || !(sh > 0) || sh > 1e6 {
				return nil, fmt.Errorf("sessions spec: think shape %q must be > 0", p[1])
			}
			sc, err := time.ParseDuration(p[2])
			if err != nil || sc < 0 {
				return nil, fmt.Errorf("sessions spec: think scale %q must be a duration >= 0", p[2])
			}
			sp.ThinkShape, sp.ThinkScale = sh, sc
		default:
			return nil, fmt.Errorf("sessions spec: unknown key %q (want n, turns, in, out, think)", k)
		}
	}
	return sp, nil
}

func parseKV(s string) (map[string]string, error) {
	out := map[string]string{}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("spec %q: %q is not key=value", s, f)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}

// Trace formats.
const (
	FormatAzure    = "azure-csv"
	FormatMooncake = "mooncake-jsonl"
	FormatShareGPT = "sharegpt-json"
	// FormatShadow (shadow.go): pairs exported by `sluice shadow export`.
)

// MaxTraceItems bounds what ParseTrace reads.
const MaxTraceItems = 10_000_000

// LoadTrace reads and parses a trace file.
func LoadTrace(path string) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w, err := ParseTrace(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w.Name = path + " (" + w.Name + ")"
	return w, nil
}

// ParseTrace detects the format (a JSON array: ShareGPT; JSON lines of exported shadow
// pairs, whose first key is "route": FormatShadow; other JSON lines: Mooncake; otherwise a
// CSV with TIMESTAMP, ContextTokens and GeneratedTokens columns: Azure) and parses it.
func ParseTrace(r io.Reader) (*Workload, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var first byte
	for {
		b, err := br.ReadByte()
		if err != nil {
			return nil, errors.New("empty trace")
		}
		if b == 0xEF || b == 0xBB || b == 0xBF || b == ' ' || b == '\t' || b == '\r' || b == '\n' {
			continue // BOM and blanks
		}
		first = b
		_ = br.UnreadByte()
		break
	}
	switch first {
	case '[':
		return parseShareGPT(br)
	case '{':
		if peek, _ := br.Peek(br.Size()); looksLikeShadow(peek) {
			return parseShadow(br)
		}
		return parseMooncake(br)
	default:
		return parseAzure(br)
	}
}

func parseAzure(r io.Reader) (*Workload, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("azure csv header: %w", err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))] = i
	}
	ti, ok1 := col["timestamp"]
	ci, ok2 := col["contexttokens"]
	gi, ok3 := col["generatedtokens"]
	if !ok1 || !ok2 || !ok3 {
		return nil, errors.New("unknown trace format: want a ShareGPT JSON array, Mooncake JSON lines, or an Azure CSV with TIMESTAMP,ContextTokens,GeneratedTokens")
	}
	w := &Workload{Name: FormatAzure}
	var t0 time.Time
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if len(rec) <= max(ti, ci, gi) {
			return nil, fmt.Errorf("line %d: %d fields", line, len(rec))
		}
		ts, err := parseAzureTime(rec[ti])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		in, err1 := strconv.Atoi(strings.TrimSpace(rec[ci]))
		out, err2 := strconv.Atoi(strings.TrimSpace(rec[gi]))
		if err1 != nil || err2 != nil || in < 0 || out < 0 || in > 1<<24 || out > 1<<24 {
			return nil, fmt.Errorf("line %d: bad token counts %q, %q", line, rec[ci], rec[gi])
		}
		if len(w.Items) == 0 {
			t0 = ts
		}
		at := ts.Sub(t0)
		if at < 0 {
			return nil, fmt.Errorf("line %d: timestamp before the first one (trace must be sorted)", line)
		}
		w.Items = append(w.Items, Item{At: at, HasAt: true, InputTokens: max(in, 1), OutputTokens: max(out, 1)})
		if len(w.Items) > MaxTraceItems {
			return nil, fmt.Errorf("more than %d requests", MaxTraceItems)
		}
	}
	if len(w.Items) == 0 {
		return nil, errors.New("azure csv: no rows")
	}
	return w, nil
}

func parseAzureTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	for _, layout := range []string{"2006-01-02 15:04:05.999999999", "2006-01-02 15:04:05", time.RFC3339Nano} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("bad TIMESTAMP %q", s)
}

type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

func parseMooncake(r io.Reader) (*Workload, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 16<<20)
	w := &Workload{Name: FormatMooncake}
	var prev float64
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var m mooncakeLine
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if m.Timestamp == nil || m.InputLength == nil || m.OutputLength == nil {
			return nil, fmt.Errorf("line %d: want timestamp, input_length, output_length", line)
		}
		ts, in, out := *m.Timestamp, *m.InputLength, *m.OutputLength
		if math.IsNaN(ts) || ts < 0 || ts > 1e12 || ts < prev {
			return nil, fmt.Errorf("line %d: timestamp %v must be >= 0 and sorted", line, ts)
		}
		if in < 0 || out < 0 || in > 1<<24 || out > 1<<24 || len(m.HashIDs) > 1<<16 {
			return nil, fmt.Errorf("line %d: bad lengths", line)
		}
		prev = ts
		w.Items = append(w.Items, Item{At: time.Duration(ts * float64(time.Millisecond)), HasAt: true,
			InputTokens: max(in, 1), OutputTokens: max(out, 1), HashIDs: m.HashIDs})
		if len(w.Items) > MaxTraceItems {
			return nil, fmt.Errorf("more than %d requests", MaxTraceItems)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(w.Items) == 0 {
		return nil, errors.New("mooncake jsonl: no lines")
	}
	return w, nil
}

type shareGPTConv struct {
	Conversations []struct {
		From  string `json:"from"`
		Value string `json:"value"`
	} `json:"conversations"`
}

// parseShareGPT takes, like vLLM's benchmark, each conversation's first human turn as the
// prompt and the length of the reply that follows as max_tokens (tokenizer count; a
// conversation without a reply gets 128).
func parseShareGPT(r io.Reader) (*Workload, error) {
	dec := json.NewDecoder(r)
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("sharegpt json: %w", err)
	}
	w := &Workload{Name: FormatShareGPT}
	for dec.More() {
		var c shareGPTConv
		if err := dec.Decode(&c); err != nil {
			return nil, fmt.Errorf("sharegpt conversation %d: %w", len(w.Items)+1, err)
		}
		for i, m := range c.Conversations {
			if (m.From != "human" && m.From != "user") || strings.TrimSpace(m.Value) == "" {
				continue
			}
			it := Item{Prompt: m.Value, OutputTokens: 128}
			if i+1 < len(c.Conversations) {
				if n := estimateTokens(c.Conversations[i+1].Value); n > 0 {
					it.OutputTokens = n
				}
			}
			it.InputTokens = estimateTokens(m.Value)
			w.Items = append(w.Items, it)
			break
		}
		if len(w.Items) > MaxTraceItems {
			return nil, fmt.Errorf("more than %d requests", MaxTraceItems)
		}
	}
	if len(w.Items) == 0 {
		return nil, errors.New("sharegpt json: no conversation with a human turn")
	}
	return w, nil
}

// estimateTokens is a cheap count (ceil(bytes/4)) used while parsing, so parsing needs no
// tokenizer.
func estimateTokens(s string) int { return (len(s) + 3) / 4 }
