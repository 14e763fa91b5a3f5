package fault

import (
	"fmt"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Record is one fault of one request in the log (GET /admin/faults/log).
type Record struct {
	Time          time.Time `json:"time"`
	RequestID     string    `json:"request_id"`
	Route         string    `json:"route,omitempty"`
	Model         string    `json:"model,omitempty"`
	FaultID       string    `json:"fault_id"` // "header" for a header fault
	Kind          Kind      `json:"kind"`
	Side          Side      `json:"side"`
	Verdict       string    `json:"verdict"` // survived, client_error, client_gone, to_client, not_triggered
	Status        int       `json:"status"`
	ErrorClass    string    `json:"error_class,omitempty"`
	Cluster       string    `json:"cluster,omitempty"`
	Attempts      int       `json:"attempts"`
	Fallback      bool      `json:"fallback,omitempty"`
	BreakerOpened bool      `json:"breaker_opened,omitempty"`
}

// ring is the bounded log.
type ring struct {
	mu   sync.Mutex
	recs []Record
	next int
	full bool
}

func (r *ring) init(n int) { r.recs = make([]Record, n) }

func (r *ring) add(rec Record) {
	r.mu.Lock()
	r.recs[r.next] = rec
	r.next++
	if r.next == len(r.recs) {
		r.next, r.full = 0, true
	}
	r.mu.Unlock()
}

// Log returns the logged faults, oldest first (at most log_size: the oldest go first).
func (e *Engine) Log() []Record {
	r := &e.log
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]Record(nil), r.recs[:r.next]...)
	}
	out := make([]Record, 0, len(r.recs))
	out = append(out, r.recs[r.next:]...)
	return append(out, r.recs[:r.next]...)
}

// KindStats counts the faults of one kind and side that took effect.
type KindStats struct {
	Kind         Kind   `json:"kind"`
	Side         Side   `json:"side"`
	Injected     uint64 `json:"injected"`
	Survived     uint64 `json:"survived"`      // upstream faults the client never noticed
	ClientErrors uint64 `json:"client_errors"` // upstream faults that reached the client as an error
}

// Stats is the engine's counters for metrics, per kind and side (only those injected at
// least once), and in total.
type Stats struct {
	Kinds        []KindStats `json:"kinds"`
	Injected     uint64      `json:"injected"`
	Survived     uint64      `json:"survived"`
	ClientErrors uint64      `json:"client_errors"`
}

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	var s Stats
	for i, k := range Kinds {
		for j, side := range []Side{Upstream, Downstream} {
			c := &e.stats[i][j]
			ks := KindStats{Kind: k, Side: side, Injected: c.injected.Load(), Survived: c.survived.Load(), ClientErrors: c.clientErrors.Load()}
			if ks.Injected == 0 {
				continue
			}
			s.Kinds = append(s.Kinds, ks)
			s.Injected += ks.Injected
			s.Survived += ks.Survived
			s.ClientErrors += ks.ClientErrors
		}
	}
	return s
}

// ReportRow is one fault's tally: how often it took effect and what followed.
type ReportRow struct {
	Fault         string `json:"fault"` // id, "header", or "other" past the row bound
	Kind          Kind   `json:"kind"`
	Side          Side   `json:"side"`
	Injected      uint64 `json:"injected"`
	Survived      uint64 `json:"survived"`
	ClientErrors  uint64 `json:"client_errors"`
	ClientGone    uint64 `json:"client_gone"`
	ToClient      uint64 `json:"to_client"`
	Fallback      uint64 `json:"fallback"`
	BreakerOpened uint64 `json:"breaker_opened"`
	NotTriggered  uint64 `json:"not_triggered"`
}

// Report is the faults injected against their outcomes, since the engine started (faults
// cleared since included).
type Report struct {
	Rows  []ReportRow `json:"rows"`
	Total ReportRow   `json:"total"`
}

// maxReportRows bounds the report's rows; later faults are tallied in a row "other".
const maxReportRows = 1000

type report struct {
	mu   sync.Mutex
	rows map[repKey]*ReportRow
	seq  []repKey
}

type repKey struct {
	id   string
	kind Kind
	side Side
}

func (r *report) add(id string, kind Kind, side Side, v string, o Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rows == nil {
		r.rows = map[repKey]*ReportRow{}
	}
	k := repKey{id, kind, side}
	row := r.rows[k]
	if row == nil {
		if len(r.rows) >= maxReportRows {
			k = repKey{"other", kind, side}
			row = r.rows[k]
		}
		if row == nil {
			row = &ReportRow{Fault: k.id, Kind: kind, Side: side}
			r.rows[k] = row
			r.seq = append(r.seq, k)
		}
	}
	tally(row, v, o)
}

func tally(row *ReportRow, v string, o Outcome) {
	if v == VerdictNotTriggered {
		row.NotTriggered++
		return
	}
	row.Injected++
	switch v {
	case VerdictSurvived:
		row.Survived++
	case VerdictClientError:
		row.ClientErrors++
	case VerdictClientGone:
		row.ClientGone++
	case VerdictToClient:
		row.ToClient++
	}
	if o.Fallback {
		row.Fallback++
	}
	if o.BreakerOpened {
		row.BreakerOpened++
	}
}

// Report returns the tally of every fault, in the order they first fired.
func (e *Engine) Report() Report {
	r := &e.rep
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := Report{Rows: make([]ReportRow, 0, len(r.seq)), Total: ReportRow{Fault: "total"}}
	for _, k := range r.seq {
		row := *r.rows[k]
		rep.Rows = append(rep.Rows, row)
		t := &rep.Total
		t.Injected += row.Injected
		t.Survived += row.Survived
		t.ClientErrors += row.ClientErrors
		t.ClientGone += row.ClientGone
		t.ToClient += row.ToClient
		t.Fallback += row.Fallback
		t.BreakerOpened += row.BreakerOpened
		t.NotTriggered += row.NotTriggered
	}
	return rep
}

// String renders the report as a table, with a last line such as "12 faults injected, 9
// survived with the client unaware".
func (r Report) String() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fault\tkind\tside\tinjected\tsurvived\tclient error\tclient gone\tto client\tfallback\tbreaker opened\tnot triggered\t")
	for _, row := range append(r.Rows, r.Total) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", row.Fault, row.Kind, row.Side,
			row.Injected, row.Survived, row.ClientErrors, row.ClientGone, row.ToClient, row.Fallback, row.BreakerOpened, row.NotTriggered)
	}
	_ = tw.Flush()
	up := r.Total.Injected - r.Total.ToClient
	fmt.Fprintf(&b, "%d faults injected, %d survived with the client unaware", r.Total.Injected, r.Total.Survived)
	if up != r.Total.Injected {
		fmt.Fprintf(&b, " (%d upstream, %d downstream)", up, r.Total.ToClient)
	}
	b.WriteByte('\n')
	return b.String()
}
