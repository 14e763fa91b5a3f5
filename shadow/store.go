package shadow

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver, registered as "sqlite"
)

// Bounds of what the Store keeps per pair and returns per query.
const (
	// MaxStoredText bounds each answer's text (cut at a rune boundary).
	MaxStoredText = 64 << 10
	// MaxStoredToolCalls bounds the tool calls kept per answer.
	MaxStoredToolCalls = 64
	// MaxStoredProblems bounds the problems kept per side and the notes per pair; each is
	// cut to MaxProblemLen bytes.
	MaxStoredProblems = 32
	MaxProblemLen     = 1 << 10
	// MaxNameLen bounds route names, request ids, session hashes, endpoints and actions.
	MaxNameLen = 256
	// MaxQueryLimit bounds how many rows one query returns; DefaultQueryLimit is used
	// when a limit ≤ 0 is given.
	MaxQueryLimit     = 100_000
	DefaultQueryLimit = 100
)

// SchemaVersion is the version of the store's tables this binary writes. A store
// written by a newer binary is refused rather than misread.
const SchemaVersion = 6

// PairRecord is one stored mirrored pair, or triple: the redacted request, the primary's
// and the candidate's answers (the baseline's, when the route has one; the replica's, when
// the request was also replayed on the primary for the noise floor), and their comparison.
//
// Result is the comparison as CompareTriple (or Compare) made it; the Store keeps every
// field of it that Accumulator.Add reads (side OK, abnormal finish, latencies, schema and
// tool-call checks and breakage, similarity, the baseline's checks, the noise-floor
// similarity, the loads) plus the problems and notes, so PairResult gives back what Add
// needs after a restart. The per-side latencies of Result are those of the answers.
type PairRecord struct {
	ID    int64  // assigned by the store
	Route string // route name
	// CandidateID names the candidate compared (the sandbox cluster, "/model" when the
	// mirror rewrites it): a new candidate's comparison does not restore an old one's pairs.
	CandidateID string
	// Instance names the gateway that mirrored the pair (shadow.instance: its host name by
	// default), so that a store the replicas of a fleet share tells whose pairs are whose.
	Instance  string
	Time      time.Time // when the primary's answer completed
	RequestID string    // the gateway's request id, if any
	Session   string    // the hash of the session (never the session id itself)
	Endpoint  string    // the request path, e.g. /v1/chat/completions
	// Request is the redacted request body (see Redact); nil when not kept.
	Request json.RawMessage
	// Primary and Candidate are the two answers (text bounded by MaxStoredText).
	Primary, Candidate Answer
	// Baseline is the baseline's answer, when the route has one (see SetBaseline).
	Baseline *Answer
	// Replica is the primary cluster's second answer, when one was made.
	Replica *Answer
	// ReplicaSimilarity is the noise-floor sample of Replica (see ReplicaSimilarity);
	// valid when ReplicaValid.
	ReplicaSimilarity float64
	ReplicaValid      bool
	// Result is the comparison of Candidate against Primary.
	Result PairResult
}

// NewPairRecord builds a record from what the mirror has at hand: the raw request body
// (redacted here with Redact), both answers and their comparison. Texts are bounded.
// Replica may be nil; when given, its noise-floor similarity is computed.
func NewPairRecord(route string, at time.Time, body []byte, primary, candidate Answer, replica *Answer, res PairResult) PairRecord {
	r := PairRecord{Route: route, Time: at, Request: Redact(body), Primary: boundAnswer(primary),
		Candidate: boundAnswer(candidate), Result: res}
	if replica != nil {
		rep := boundAnswer(*replica)
		r.Replica = &rep
		r.ReplicaSimilarity, r.ReplicaValid = ReplicaSimilarity(primary, *replica)
	}
	return r
}

// SetBaseline keeps the baseline's answer (the primary's version asked in a sandbox at the
// same moment as the candidate), bounded as the others. Its checks, the noise-floor
// similarity against the primary and the loads are in Result.
func (r *PairRecord) SetBaseline(b Answer) {
	bb := boundAnswer(b)
	r.Baseline = &bb
}

// PairResult returns the comparison to feed Accumulator.Add.
func (r PairRecord) PairResult() PairResult { return r.Result }

// VerdictRecord is one stored verdict with the sample counts behind it and the action the
// gateway took on it (for example "weight 10→20", "weight 20→0", or "" for none).
type VerdictRecord struct {
	ID          int64
	Route       string
	CandidateID string
	Time        time.Time
	Verdict     Verdict
	Pairs       int64 // pairs behind the verdict (the gateway stores the accumulator's totals)
	Replicas    int64 // replica comparisons (noise-floor samples) behind it
	Action      string
	// Instance names the gateway that judged (see PairRecord.Instance).
	Instance string
}

// Store keeps pairs and verdicts in an embedded SQLite database, or in a PostgreSQL
// database that the replicas of a fleet share. It is safe for concurrent use.
type Store struct {
	db         *sql.DB
	d          dialect
	path       string // the file, or the URL with its password masked
	sessionKey []byte
}

// c is the store's database in its dialect.
func (s *Store) c() conn { return conn{q: s.db, d: s.d} }

// OpenStore opens (creating if needed) the store at path; "" or ":memory:" keeps it in
// memory for the life of the Store. A file store uses WAL mode, so a report can read it
// while the gateway writes, and waits up to 5 s for a lock. A postgres:// or postgresql://
// URL opens that PostgreSQL database instead (IsPostgresURL), shared by every replica that
// names it. The tables are created or migrated to SchemaVersion (under an advisory lock in
// PostgreSQL, so that replicas starting together migrate once).
func OpenStore(ctx context.Context, path string) (*Store, error) {
	if IsPostgresURL(path) {
		return openPostgresStore(ctx, path)
	}
	mem := path == "" || path == ":memory:"
	var dsn string
	if mem {
		dsn = ":memory:"
	} else {
		esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
		dsn = "file:" + esc + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("shadow store %s: %w", describePath(path), err)
	}
	if mem {
		// Every connection to ":memory:" is a database of its own: keep exactly one.
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		db.SetConnMaxLifetime(0)
		db.SetConnMaxIdleTime(0)
	} else {
		// One writer at a time anyway; a few readers for reports.
		db.SetMaxOpenConns(4)
	}
	s := &Store{db: db, d: sqliteDialect, path: path}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("shadow store %s: %w", describePath(path), err)
	}
	if err := db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'session_key'`).Scan(&s.sessionKey); err != nil || len(s.sessionKey) < 16 {
		db.Close()
		return nil, fmt.Errorf("shadow store %s: session key: %v", describePath(path), err)
	}
	return s, nil
}

// openPostgresStore opens and migrates the PostgreSQL store of dsn.
func openPostgresStore(ctx context.Context, dsn string) (*Store, error) {
	where := RedactDSN(dsn)
	db, err := openPostgres(ctx, dsn, false)
	if err != nil {
		return nil, fmt.Errorf("shadow store %s: %w", where, err)
	}
	s := &Store{db: db, d: postgresDialect, path: where}
	if err := s.migratePostgres(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("shadow store %s: %w", where, err)
	}
	if err := s.c().queryRow(ctx, `SELECT value FROM meta WHERE key = 'session_key'`).Scan(&s.sessionKey); err != nil || len(s.sessionKey) < 16 {
		db.Close()
		return nil, fmt.Errorf("shadow store %s: session key: %v", where, err)
	}
	return s, nil
}

// SessionHash is the store's keyed hash of a session id (HMAC-SHA256, 16 hex digits): pairs
// of one conversation share it, and it cannot be reversed by hashing guessed ids.
func (s *Store) SessionHash(session string) string {
	m := hmac.New(sha256.New, s.sessionKey)
	m.Write([]byte(session))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// OpenStoreReadOnly opens an existing store file for reading only (reports and exports
// from the command line, while a gateway may be writing it): nothing is created or
// migrated, and a store of another schema version is refused with what to do.
//
// A postgres:// URL opens that database with every transaction read-only.
func OpenStoreReadOnly(ctx context.Context, path string) (*Store, error) {
	s := &Store{d: sqliteDialect, path: path}
	if IsPostgresURL(path) {
		s.d, s.path = postgresDialect, RedactDSN(path)
		db, err := openPostgres(ctx, path, true)
		if err != nil {
			return nil, fmt.Errorf("shadow store %s: %w", s.path, err)
		}
		s.db = db
	} else {
		esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
		db, err := sql.Open("sqlite", "file:"+esc+"?mode=ro&_pragma=busy_timeout(5000)")
		if err != nil {
			return nil, fmt.Errorf("shadow store %s: %w", path, err)
		}
		db.SetMaxOpenConns(2)
		s.db = db
	}
	path, db := s.path, s.db
	var v int
	if err := s.c().queryRow(ctx, `SELECT version FROM schema_version`).Scan(&v); err != nil {
		db.Close()
		return nil, fmt.Errorf("shadow store %s: not a Sluice shadow store (%v)", path, err)
	}
	switch {
	case v > SchemaVersion:
		db.Close()
		return nil, fmt.Errorf("shadow store %s: schema version %d is newer than this binary's %d: use a newer sluice", path, v, SchemaVersion)
	case v < SchemaVersion:
		db.Close()
		return nil, fmt.Errorf("shadow store %s: schema version %d is older than this binary's %d: start the gateway (it migrates the store) or use the sluice that wrote it", path, v, SchemaVersion)
	}
	if err := s.c().queryRow(ctx, `SELECT value FROM meta WHERE key = 'session_key'`).Scan(&s.sessionKey); err != nil {
		db.Close()
		return nil, fmt.Errorf("shadow store %s: session key: %w", path, err)
	}
	return s, nil
}

func describePath(p string) string {
	if p == "" || p == ":memory:" {
		return "(in memory)"
	}
	return p
}

// Path returns the file the store lives in ("" or ":memory:" in memory), or its
// PostgreSQL URL with the password masked.
func (s *Store) Path() string { return s.path }

// Shared reports whether the store is a PostgreSQL database that several replicas may
// share (their pairs are judged together: FleetInput).
func (s *Store) Shared() bool { return s.d.dollar }

// Kind is "postgres", "sqlite" (a file) or "memory".
func (s *Store) Kind() string {
	switch {
	case s.d.dollar:
		return "postgres"
	case s.path == "" || s.path == ":memory:":
		return "memory"
	}
	return "sqlite"
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// answerCols and checkCols are the columns of one answer and of its checks, prefixed p_
// (primary), b_ (baseline), c_ (candidate) or r_ (replica: the answer only).
var answerCols = []string{"status", "error_class", "ttft_ms", "itl_ms", "e2e_ms", "output_tokens", "finish_reason", "text", "tool_calls"}
var checkCols = []string{"ok", "abnormal", "json_valid", "schema_checked", "schema_broken", "tool_checked", "tool_broken", "problems"}

// confCols are a side's confidence (primary, baseline, candidate) as the comparison used it
// (SideResult.Confidence; a baseline answer kept without its checks, the answer's): NULL when
// its answer carried no logprobs to compare. A restored answer's Confidence is its side's. A
// replica's is not kept (no verdict reads it).
var confCols = []string{"conf_tokens", "mean_entropy", "low_margin"}

func confDefs(p string) string {
	return fmt.Sprintf(",\n\t%sconf_tokens INTEGER,\n\t%smean_entropy REAL,\n\t%slow_margin REAL", p, p, p)
}

func confValues(c Confidence) []any {
	if !c.Valid() {
		return []any{nil, nil, nil}
	}
	return []any{c.Tokens, c.MeanEntropy, c.LowMargin}
}

type confScan struct {
	tokens             sql.NullInt64
	entropy, lowMargin sql.NullFloat64
}

func (c *confScan) dest() []any { return []any{&c.tokens, &c.entropy, &c.lowMargin} }

func (c *confScan) confidence() Confidence {
	if !c.tokens.Valid || !c.entropy.Valid || !c.lowMargin.Valid {
		return Confidence{}
	}
	v := Confidence{Tokens: int(c.tokens.Int64), MeanEntropy: c.entropy.Float64, LowMargin: c.lowMargin.Float64}
	if !v.Valid() {
		return Confidence{}
	}
	return v
}

func prefixed(p string, cols []string) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = p + c
	}
	return out
}

func colDefs(p string) string { return colDefsIn(sqliteDialect, p) }

// colDefsIn writes the columns of one side, prefixed p, with the types of dialect d.
func colDefsIn(d dialect, p string) string {
	kinds := map[string]string{"status": "int", "error_class": "text", "ttft_ms": "real", "itl_ms": "real",
		"e2e_ms": "real", "output_tokens": "int", "finish_reason": "text", "text": "text", "tool_calls": "text",
		"ok": "bool", "abnormal": "bool", "json_valid": "bool", "schema_checked": "bool",
		"schema_broken": "bool", "tool_checked": "bool", "tool_broken": "bool", "problems": "text"}
	cols := answerCols
	if p != "r_" {
		cols = append(append([]string(nil), answerCols...), checkCols...)
	}
	var b strings.Builder
	for _, c := range cols {
		fmt.Fprintf(&b, ",\n\t%s%s %s", p, c, d.colType(kinds[c]))
	}
	return b.String()
}

// migrations[i] brings the schema from version i to i+1.
var migrations = []string{
	`CREATE TABLE pairs (
	id INTEGER PRIMARY KEY AUTOINCREMENT,
	route TEXT NOT NULL,
	ts_ns INTEGER NOT NULL,
	request_id TEXT NOT NULL DEFAULT '',
	session_hash TEXT NOT NULL DEFAULT '',
	endpoint TEXT NOT NULL DEFAULT '',
	request TEXT` + colDefs("p_") + colDefs("c_") + `,
	r_present INTEGER NOT NULL DEFAULT 0` + colDefs("r_") + `,
	similarity REAL,
	replica_similarity REAL,
	tool_names_match INTEGER,
	notes TEXT
);
CREATE INDEX pairs_route_ts ON pairs(route, ts_ns, id);
CREATE TABLE verdicts (
	id INTEGER PRIMARY KEY AUTOINCREMENT,
	route TEXT NOT NULL,
	ts_ns INTEGER NOT NULL,
	decision TEXT NOT NULL,
	reason TEXT NOT NULL,
	evidence TEXT NOT NULL,
	pairs INTEGER NOT NULL DEFAULT 0,
	replicas INTEGER NOT NULL DEFAULT 0,
	action TEXT NOT NULL DEFAULT ''
);
CREATE INDEX verdicts_route_ts ON verdicts(route, ts_ns, id);`,
	// 2: the candidate a pair or verdict belongs to, so a new candidate starts afresh.
	`ALTER TABLE pairs ADD COLUMN candidate TEXT NOT NULL DEFAULT '';
ALTER TABLE verdicts ADD COLUMN candidate TEXT NOT NULL DEFAULT '';
CREATE INDEX pairs_route_candidate_ts ON pairs(route, candidate, ts_ns, id);`,
	// 3: the store's own key for session hashes (HMAC), so they cannot be reversed by
	// hashing guessed session ids.
	`CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
INSERT INTO meta (key, value) VALUES ('session_key', randomblob(32));`,
	// 4: the baseline's answer and checks (the primary's version asked in a sandbox at the
	// same moment as the candidate), the primary-against-baseline similarity (the noise
	// floor) and the loads each side's cluster served when the request was sent to it.
	addColumns("b_present INTEGER NOT NULL DEFAULT 0" + colDefs("b_") +
		",\n\tnoise_similarity REAL,\n\tload_primary REAL,\n\tload_baseline REAL,\n\tload_candidate REAL"),
	// 5: the gateway a pair or verdict came from (in a store the replicas of a fleet share),
	// and the request rates each gateway measured, judged together with the pairs.
	`ALTER TABLE pairs ADD COLUMN instance TEXT NOT NULL DEFAULT '';
ALTER TABLE verdicts ADD COLUMN instance TEXT NOT NULL DEFAULT '';
` + ratesTable(sqliteDialect),
	// 6: each side's confidence (its answer's logprobs summarised), a verdict metric.
	addColumns(confDefs("p_") + confDefs("b_") + confDefs("c_")),
}

// ratesTable creates the table of request rates: per route, candidate and gateway instance
// the latest rates per endpoint it measured (see RateRecord).
func ratesTable(d dialect) string {
	return `CREATE TABLE rates (
	route TEXT NOT NULL,
	candidate TEXT NOT NULL,
	instance TEXT NOT NULL,
	ts_ns ` + d.colType("bigint") + ` NOT NULL,
	reference_rate ` + d.colType("real") + ` NOT NULL,
	candidate_rate ` + d.colType("real") + ` NOT NULL,
	PRIMARY KEY (route, candidate, instance)
)`
}

// addColumns turns a list of column definitions (as colDefs writes them, comma separated)
// into the ALTER TABLE statements adding them to pairs: SQLite adds one column a statement.
func addColumns(defs string) string {
	var b strings.Builder
	for _, d := range strings.Split(defs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			fmt.Fprintf(&b, "ALTER TABLE pairs ADD COLUMN %s;\n", d)
		}
	}
	return b.String()
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("create schema_version: %w", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	var v int
	err = tx.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version(version) VALUES (0)`); err != nil {
			return fmt.Errorf("init schema_version: %w", err)
		}
	case err != nil:
		return fmt.Errorf("read schema_version: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this binary's %d: use a newer sluice", v, len(migrations))
	}
	for i := v; i < len(migrations); i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migrate to version %d: %w", i+1, err)
		}
	}
	if v < len(migrations) {
		if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, len(migrations)); err != nil {
			return fmt.Errorf("set schema_version: %w", err)
		}
	}
	return tx.Commit()
}

// cut bounds s to n bytes at a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func boundAnswer(a Answer) Answer {
	a.Text = maskSecrets(cut(a.Text, MaxStoredText))
	a.ErrorClass = cut(a.ErrorClass, MaxNameLen)
	a.FinishReason = cut(a.FinishReason, MaxNameLen)
	if len(a.ToolCalls) > MaxStoredToolCalls {
		a.ToolCalls = a.ToolCalls[:MaxStoredToolCalls]
	}
	if len(a.ToolCalls) > 0 {
		calls := make([]ToolCall, len(a.ToolCalls))
		for i, c := range a.ToolCalls {
			calls[i] = ToolCall{Name: cut(c.Name, MaxNameLen), Arguments: maskSecrets(cut(c.Arguments, MaxStoredText))}
		}
		a.ToolCalls = calls
	}
	return a
}

func boundList(xs []string) []string {
	if len(xs) > MaxStoredProblems {
		xs = xs[:MaxStoredProblems]
	}
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = cut(x, MaxProblemLen)
	}
	return out
}

func durMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func msDur(v float64) time.Duration {
	if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > float64(math.MaxInt64/int64(time.Millisecond)) {
		return 0
	}
	return time.Duration(math.Round(v * float64(time.Millisecond)))
}

func jsonList(xs []string) (string, error) {
	if len(xs) == 0 {
		return "", nil
	}
	b, err := json.Marshal(boundList(xs))
	return string(b), err
}

func answerValues(a Answer) ([]any, error) {
	a = boundAnswer(a)
	var calls any
	if len(a.ToolCalls) > 0 {
		sc := make([]ExportToolCall, len(a.ToolCalls))
		for i, c := range a.ToolCalls {
			sc[i] = ExportToolCall(c)
		}
		b, err := json.Marshal(sc)
		if err != nil {
			return nil, fmt.Errorf("tool calls: %w", err)
		}
		calls = string(b)
	}
	return []any{a.Status, a.ErrorClass, durMS(a.TTFT), durMS(a.ITL), durMS(a.E2E), a.OutputTokens, a.FinishReason, a.Text, calls}, nil
}

func checkValues(s SideResult) ([]any, error) {
	probs, err := jsonList(s.Problems)
	if err != nil {
		return nil, err
	}
	return []any{s.OK, s.AbnormalFinish, s.JSONValid, s.SchemaChecked, s.SchemaBroken, s.ToolCallChecked, s.ToolCallBroken, probs}, nil
}

// baselineValues are the b_ columns of a triple and their values: the baseline's answer
// and its checks. Either may be missing: without the answer (a result whose answer was not
// kept) only its latencies and tokens are written, from the checks, and b_status stays NULL;
// without the checks (an answer not compared) the check columns stay NULL.
func baselineValues(a *Answer, chk *SideResult) (cols []string, vals []any, err error) {
	cols, vals = []string{"b_present"}, []any{true}
	switch {
	case a != nil:
		av, err := answerValues(*a)
		if err != nil {
			return nil, nil, err
		}
		cols, vals = append(cols, prefixed("b_", answerCols)...), append(vals, av...)
	case chk != nil:
		cols = append(cols, prefixed("b_", []string{"ttft_ms", "itl_ms", "e2e_ms", "output_tokens"})...)
		vals = append(vals, durMS(chk.TTFT), durMS(chk.ITL), durMS(chk.E2E), chk.OutputTokens)
	}
	if chk != nil {
		cv, err := checkValues(*chk)
		if err != nil {
			return nil, nil, err
		}
		cols, vals = append(cols, prefixed("b_", checkCols)...), append(vals, cv...)
	}
	// The confidence the comparison used (the checks'), else the answer's.
	switch {
	case chk != nil:
		cols, vals = append(cols, prefixed("b_", confCols)...), append(vals, confValues(chk.Confidence)...)
	case a != nil:
		cols, vals = append(cols, prefixed("b_", confCols)...), append(vals, confValues(a.Confidence)...)
	}
	return cols, vals, nil
}

// loadsValid reports whether l was measured and can be stored: a non-finite load counts as
// unmeasured.
func loadsValid(l Loads) bool {
	if !l.Valid {
		return false
	}
	for _, v := range []float64{l.Primary, l.Baseline, l.Candidate} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

func nullFloat(v float64, valid bool) any {
	if !valid || math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return v
}

// AddPair stores one pair. Names, texts, problems and the request are bounded; the request
// must already be redacted (NewPairRecord does it) and is stored only if it is JSON.
func (s *Store) AddPair(ctx context.Context, r PairRecord) error {
	if r.Route == "" {
		return fmt.Errorf("shadow store: add pair: %w", errNoRoute)
	}
	cols := []string{"route", "ts_ns", "request_id", "session_hash", "endpoint", "request"}
	var req any
	if len(r.Request) > 0 {
		if len(r.Request) > MaxRedactedBytes || !json.Valid(r.Request) {
			req = string(Redact(r.Request)) // bounds it, or gives "" when not JSON
			if req == "" {
				req = nil
			}
		} else {
			req = string(r.Request)
		}
	}
	ts := r.Time
	if ts.IsZero() {
		ts = time.Now()
	}
	vals := []any{cut(r.Route, MaxNameLen), ts.UnixNano(), cut(r.RequestID, MaxNameLen), cut(r.Session, MaxNameLen),
		cut(r.Endpoint, MaxNameLen), req}
	for _, side := range []struct {
		p   string
		a   Answer
		chk SideResult
	}{{"p_", r.Primary, r.Result.Primary}, {"c_", r.Candidate, r.Result.Candidate}} {
		av, err := answerValues(side.a)
		if err != nil {
			return fmt.Errorf("shadow store: add pair: %w", err)
		}
		cv, err := checkValues(side.chk)
		if err != nil {
			return fmt.Errorf("shadow store: add pair: %w", err)
		}
		cols = append(append(cols, prefixed(side.p, answerCols)...), prefixed(side.p, checkCols)...)
		vals = append(append(vals, av...), cv...)
		cols, vals = append(cols, prefixed(side.p, confCols)...), append(vals, confValues(side.chk.Confidence)...)
	}
	if r.Replica != nil {
		av, err := answerValues(*r.Replica)
		if err != nil {
			return fmt.Errorf("shadow store: add pair: %w", err)
		}
		cols = append(append(cols, "r_present"), prefixed("r_", answerCols)...)
		vals = append(append(vals, true), av...)
	}
	if r.Baseline != nil || r.Result.Baseline != nil {
		bc, bv, err := baselineValues(r.Baseline, r.Result.Baseline)
		if err != nil {
			return fmt.Errorf("shadow store: add pair: baseline: %w", err)
		}
		cols, vals = append(cols, bc...), append(vals, bv...)
	}
	notes, err := jsonList(r.Result.Notes)
	if err != nil {
		return fmt.Errorf("shadow store: add pair: %w", err)
	}
	cols = append(cols, "similarity", "replica_similarity", "tool_names_match", "notes", "candidate", "noise_similarity", "instance")
	vals = append(vals, nullFloat(r.Result.Similarity, r.Result.SimilarityValid),
		nullFloat(r.ReplicaSimilarity, r.ReplicaValid), r.Result.ToolNamesMatch, notes, cut(r.CandidateID, MaxNameLen),
		nullFloat(r.Result.NoiseSimilarity, r.Result.NoiseValid), cut(r.Instance, MaxNameLen))
	if l := r.Result.Loads; loadsValid(l) {
		cols = append(cols, "load_primary", "load_baseline", "load_candidate")
		vals = append(vals, l.Primary, l.Baseline, l.Candidate)
	}
	q := "INSERT INTO pairs (" + strings.Join(cols, ", ") + ") VALUES (" + strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
	if _, err := s.c().exec(ctx, q, vals...); err != nil {
		return fmt.Errorf("shadow store: add pair: %w", err)
	}
	return nil
}

// AddVerdict stores one verdict with its evidence.
func (s *Store) AddVerdict(ctx context.Context, v VerdictRecord) error {
	if v.Route == "" {
		return fmt.Errorf("shadow store: add verdict: %w", errNoRoute)
	}
	ev := v.Verdict.Evidence
	if ev == nil {
		ev = []Evidence{}
	}
	b, err := json.Marshal(sanitizeEvidence(ev))
	if err != nil {
		return fmt.Errorf("shadow store: add verdict: evidence: %w", err)
	}
	ts := v.Time
	if ts.IsZero() {
		ts = time.Now()
	}
	_, err = s.c().exec(ctx, `INSERT INTO verdicts (route, ts_ns, decision, reason, evidence, pairs, replicas, action, candidate, instance)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, cut(v.Route, MaxNameLen), ts.UnixNano(), cut(string(v.Verdict.Decision), MaxNameLen),
		cut(v.Verdict.Reason, MaxProblemLen*4), string(b), v.Pairs, v.Replicas, cut(v.Action, MaxNameLen), cut(v.CandidateID, MaxNameLen),
		cut(v.Instance, MaxNameLen))
	if err != nil {
		return fmt.Errorf("shadow store: add verdict: %w", err)
	}
	return nil
}

// sanitizeEvidence replaces the non-finite numbers JSON cannot hold (an infinite effect
// when the primary's median is zero) by the largest finite ones.
func sanitizeEvidence(ev []Evidence) []Evidence {
	out := make([]Evidence, len(ev))
	for i, e := range ev {
		for _, f := range []*float64{&e.Statistic, &e.Z, &e.P, &e.Effect, &e.Bound, &e.Primary, &e.Cand, &e.Ratio, &e.Low, &e.High} {
			*f = finiteOr(*f)
		}
		out[i] = e
	}
	return out
}

func finiteOr(f float64) float64 {
	switch {
	case math.IsNaN(f):
		return 0
	case math.IsInf(f, 1):
		return math.MaxFloat64
	case math.IsInf(f, -1):
		return -math.MaxFloat64
	}
	return f
}

func clampLimit(limit int) int {
	switch {
	case limit <= 0:
		return DefaultQueryLimit
	case limit > MaxQueryLimit:
		return MaxQueryLimit
	}
	return limit
}

// pairSelect lists the columns scanPair reads, in order.
var pairSelect = func() string {
	side := func(p string) []string {
		return prefixed(p, append(append([]string(nil), answerCols...), checkCols...))
	}
	cols := []string{"id", "route", "ts_ns", "request_id", "session_hash", "endpoint", "request"}
	cols = append(cols, side("p_")...)
	cols = append(cols, side("c_")...)
	cols = append(append(cols, "r_present"), prefixed("r_", answerCols)...)
	cols = append(cols, "similarity", "replica_similarity", "tool_names_match", "notes", "candidate")
	cols = append(append(cols, "b_present"), side("b_")...)
	cols = append(cols, "noise_similarity", "load_primary", "load_baseline", "load_candidate", "instance")
	for _, p := range []string{"p_", "b_", "c_"} {
		cols = append(cols, prefixed(p, confCols)...)
	}
	return strings.Join(cols, ", ")
}()

type answerScan struct {
	status, tokens             sql.NullInt64
	errClass, finish, text, tc sql.NullString
	ttft, itl, e2e             sql.NullFloat64
}

func (a *answerScan) dest() []any {
	return []any{&a.status, &a.errClass, &a.ttft, &a.itl, &a.e2e, &a.tokens, &a.finish, &a.text, &a.tc}
}

func (a *answerScan) answer() (Answer, error) {
	out := Answer{Status: int(a.status.Int64), ErrorClass: a.errClass.String, TTFT: msDur(a.ttft.Float64),
		ITL: msDur(a.itl.Float64), E2E: msDur(a.e2e.Float64), OutputTokens: int(a.tokens.Int64),
		FinishReason: a.finish.String, Text: a.text.String}
	if a.tc.String != "" {
		var sc []ExportToolCall
		if err := json.Unmarshal([]byte(a.tc.String), &sc); err != nil {
			return out, fmt.Errorf("tool calls: %w", err)
		}
		for _, c := range sc {
			out.ToolCalls = append(out.ToolCalls, ToolCall(c))
		}
	}
	return out, nil
}

// loadScan reads load_primary, load_baseline and load_candidate: all NULL when the loads
// were not measured.
type loadScan struct{ primary, baseline, candidate sql.NullFloat64 }

func (l *loadScan) dest() []any { return []any{&l.primary, &l.baseline, &l.candidate} }

func (l *loadScan) loads() Loads {
	if !l.primary.Valid && !l.baseline.Valid && !l.candidate.Valid {
		return Loads{}
	}
	return Loads{Primary: l.primary.Float64, Baseline: l.baseline.Float64, Candidate: l.candidate.Float64, Valid: true}
}

type checkScan struct {
	ok, abnormal, jsonValid, schemaChecked, schemaBroken, toolChecked, toolBroken sql.NullBool
	problems                                                                      sql.NullString
}

func (c *checkScan) dest() []any {
	return []any{&c.ok, &c.abnormal, &c.jsonValid, &c.schemaChecked, &c.schemaBroken, &c.toolChecked, &c.toolBroken, &c.problems}
}

func (c *checkScan) side(a Answer) (SideResult, error) {
	s := SideResult{OK: c.ok.Bool, AbnormalFinish: c.abnormal.Bool, TTFT: a.TTFT, ITL: a.ITL, E2E: a.E2E,
		OutputTokens: a.OutputTokens, JSONValid: c.jsonValid.Bool, SchemaChecked: c.schemaChecked.Bool,
		SchemaBroken: c.schemaBroken.Bool, ToolCallChecked: c.toolChecked.Bool, ToolCallBroken: c.toolBroken.Bool,
		Confidence: a.Confidence}
	var err error
	s.Problems, err = parseList(c.problems.String)
	return s, err
}

func parseList(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		return nil, fmt.Errorf("list %q: %w", cut(s, 64), err)
	}
	return out, nil
}

func scanPair(rows *sql.Rows) (PairRecord, error) {
	var (
		r                 PairRecord
		tsNS              int64
		req               sql.NullString
		pa, ca, ra, ba    answerScan
		pc, cc, bc        checkScan
		rPresent          sql.NullBool
		bPresent          sql.NullBool
		sim, repSim       sql.NullFloat64
		noise             sql.NullFloat64
		loads             loadScan
		namesMatch        sql.NullBool
		notes             sql.NullString
		reqID, sess, endp sql.NullString
		pcf, bcf, ccf     confScan
	)
	dest := []any{&r.ID, &r.Route, &tsNS, &reqID, &sess, &endp, &req}
	dest = append(append(dest, pa.dest()...), pc.dest()...)
	dest = append(append(dest, ca.dest()...), cc.dest()...)
	dest = append(append(dest, &rPresent), ra.dest()...)
	dest = append(dest, &sim, &repSim, &namesMatch, &notes, &r.CandidateID)
	dest = append(append(append(dest, &bPresent), ba.dest()...), bc.dest()...)
	dest = append(append(dest, &noise), loads.dest()...)
	dest = append(dest, &r.Instance)
	dest = append(append(append(dest, pcf.dest()...), bcf.dest()...), ccf.dest()...)
	if err := rows.Scan(dest...); err != nil {
		return r, err
	}
	r.Time = time.Unix(0, tsNS)
	r.RequestID, r.Session, r.Endpoint = reqID.String, sess.String, endp.String
	if req.Valid && req.String != "" {
		r.Request = json.RawMessage(req.String)
	}
	var err error
	if r.Primary, err = pa.answer(); err != nil {
		return r, fmt.Errorf("pair %d primary: %w", r.ID, err)
	}
	if r.Candidate, err = ca.answer(); err != nil {
		return r, fmt.Errorf("pair %d candidate: %w", r.ID, err)
	}
	if rPresent.Bool {
		rep, err := ra.answer()
		if err != nil {
			return r, fmt.Errorf("pair %d replica: %w", r.ID, err)
		}
		r.Replica = &rep
	}
	res := PairResult{
		StatusMatch:     r.Primary.Status == r.Candidate.Status,
		ErrorClassMatch: r.Primary.ErrorClass == r.Candidate.ErrorClass,
		FinishMatch:     r.Primary.FinishReason == r.Candidate.FinishReason,
		TTFTDelta:       r.Candidate.TTFT - r.Primary.TTFT,
		ITLDelta:        r.Candidate.ITL - r.Primary.ITL,
		E2EDelta:        r.Candidate.E2E - r.Primary.E2E,
		TokenDelta:      r.Candidate.OutputTokens - r.Primary.OutputTokens,
		Similarity:      sim.Float64,
		SimilarityValid: sim.Valid,
		ToolNamesMatch:  namesMatch.Bool,
	}
	r.Primary.Confidence, r.Candidate.Confidence = pcf.confidence(), ccf.confidence()
	if res.Primary, err = pc.side(r.Primary); err != nil {
		return r, fmt.Errorf("pair %d primary problems: %w", r.ID, err)
	}
	if res.Candidate, err = cc.side(r.Candidate); err != nil {
		return r, fmt.Errorf("pair %d candidate problems: %w", r.ID, err)
	}
	if res.Notes, err = parseList(notes.String); err != nil {
		return r, fmt.Errorf("pair %d notes: %w", r.ID, err)
	}
	if bPresent.Bool {
		b, err := ba.answer()
		if err != nil {
			return r, fmt.Errorf("pair %d baseline: %w", r.ID, err)
		}
		b.Confidence = bcf.confidence()
		if ba.status.Valid { // else only the checks were kept (see baselineValues)
			r.Baseline = &b
		}
		if bc.ok.Valid {
			bs, err := bc.side(b)
			if err != nil {
				return r, fmt.Errorf("pair %d baseline problems: %w", r.ID, err)
			}
			res.Baseline = &bs
		}
	}
	res.NoiseSimilarity, res.NoiseValid = noise.Float64, noise.Valid
	res.Loads = loads.loads()
	r.Result = res
	r.ReplicaSimilarity, r.ReplicaValid = repSim.Float64, repSim.Valid
	return r, nil
}

// Pairs returns up to limit pairs of route ("" for every route), newest first (limit ≤ 0:
// DefaultQueryLimit; at most MaxQueryLimit).
func (s *Store) Pairs(ctx context.Context, route string, limit int) ([]PairRecord, error) {
	return newest(ctx, s.c(), "pairs", pairSelect, route, "", limit, scanPair)
}

// Verdicts returns up to limit verdicts of route ("" for every route), newest first.
func (s *Store) Verdicts(ctx context.Context, route string, limit int) ([]VerdictRecord, error) {
	return newest(ctx, s.c(), "verdicts", verdictCols, route, "", limit, scanVerdict)
}

// verdictCols are the columns scanVerdict reads.
const verdictCols = "id, route, ts_ns, decision, reason, evidence, pairs, replicas, action, candidate, instance"

// Steps returns up to limit verdicts of route ("" for every route) that changed a weight
// (their action starts "weight ": a gateway's own progression, or the control plane's),
// newest first: the rollout's steps, kept in view however many verdicts followed them.
func (s *Store) Steps(ctx context.Context, route string, limit int) ([]VerdictRecord, error) {
	return newest(ctx, s.c(), "verdicts", verdictCols, route, stepAction, limit, scanVerdict)
}

func scanVerdict(rows *sql.Rows) (VerdictRecord, error) {
	var (
		v        VerdictRecord
		tsNS     int64
		decision string
		evidence string
	)
	if err := rows.Scan(&v.ID, &v.Route, &tsNS, &decision, &v.Verdict.Reason, &evidence, &v.Pairs, &v.Replicas, &v.Action, &v.CandidateID, &v.Instance); err != nil {
		return v, err
	}
	v.Time = time.Unix(0, tsNS)
	v.Verdict.Decision = Decision(decision)
	if err := json.Unmarshal([]byte(evidence), &v.Verdict.Evidence); err != nil {
		return v, fmt.Errorf("verdict %d evidence: %w", v.ID, err)
	}
	return v, nil
}

// newest runs SELECT cols FROM table [WHERE route = ?] [AND cond] newest first, scanning
// each row.
func newest[T any](ctx context.Context, db conn, table, cols, route, cond string, limit int, scan func(*sql.Rows) (T, error)) ([]T, error) {
	q := "SELECT " + cols + " FROM " + table
	var where []string
	args := []any{}
	if route != "" {
		where = append(where, "route = ?")
		args = append(args, route)
	}
	if cond != "" {
		where = append(where, cond)
	}
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY ts_ns DESC, id DESC LIMIT ?"
	args = append(args, clampLimit(limit))
	rows, err := db.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("shadow store: %s: %w", table, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("shadow store: %s: %w", table, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("shadow store: %s: %w", table, err)
	}
	return out, nil
}

// Routes returns the routes that have pairs or verdicts, sorted.
func (s *Store) Routes(ctx context.Context) ([]string, error) {
	rows, err := s.c().query(ctx, `SELECT DISTINCT route FROM pairs UNION SELECT DISTINCT route FROM verdicts`)
	if err != nil {
		return nil, fmt.Errorf("shadow store: routes: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			return nil, fmt.Errorf("shadow store: routes: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("shadow store: routes: %w", err)
	}
	sort.Strings(out)
	return out, nil
}

// Count returns how many pairs and verdicts of route ("" for all) are stored.
func (s *Store) Count(ctx context.Context, route string) (pairs, verdicts int64, err error) {
	for _, t := range []struct {
		table string
		n     *int64
	}{{"pairs", &pairs}, {"verdicts", &verdicts}} {
		q := "SELECT COUNT(*) FROM " + t.table
		var args []any
		if route != "" {
			q += " WHERE route = ?"
			args = append(args, route)
		}
		if err := s.c().queryRow(ctx, q, args...).Scan(t.n); err != nil {
			return 0, 0, fmt.Errorf("shadow store: count %s: %w", t.table, err)
		}
	}
	return pairs, verdicts, nil
}

// StepRetention is how many weight steps (verdicts whose action changed a weight, what Steps
// reads) Prune keeps per route, apart from the route's other verdicts: a control plane
// recovers its weights from them, so the fleet's every-interval verdicts must never push out
// the first step of the rollout in progress. Steps are few (one per interval at most).
var StepRetention = 10000

// stepAction is the SQL test of a weight step's action (as Steps selects them).
const stepAction = "action LIKE 'weight %'"

// Prune keeps the newest keep pairs and the newest keep verdicts of route and deletes the
// older ones; route "" prunes every route (keep per route). keep ≤ 0 deletes all of them.
// Weight steps are counted apart, the newest StepRetention kept (none when keep ≤ 0).
// Request rates older than RateRetention before the route's newest are deleted too.
func (s *Store) Prune(ctx context.Context, route string, keep int) error {
	routes := []string{route}
	if route == "" {
		var err error
		if routes, err = s.Routes(ctx); err != nil {
			return err
		}
	}
	keep = max(keep, 0)
	for _, r := range routes {
		steps := StepRetention
		if keep == 0 {
			steps = 0
		}
		for _, p := range []struct {
			table, which string
			keep         int
		}{{"pairs", "", keep}, {"verdicts", " AND NOT " + stepAction, keep}, {"verdicts", " AND " + stepAction, steps}} {
			// The rows past the newest keep: usually few, found along the (route, ts_ns, id) index.
			q := "DELETE FROM " + p.table + " WHERE id IN (SELECT id FROM " + p.table +
				" WHERE route = ?" + p.which + " ORDER BY ts_ns DESC, id DESC LIMIT " + s.d.noLimit + " OFFSET ?)"
			if _, err := s.c().exec(ctx, q, r, p.keep); err != nil {
				return fmt.Errorf("shadow store: prune %s of %q: %w", p.table, r, err)
			}
		}
		if _, err := s.c().exec(ctx, `DELETE FROM rates WHERE route = ? AND ts_ns < (SELECT MAX(ts_ns) FROM rates WHERE route = ?) - ?`,
			r, r, int64(RateRetention)); err != nil {
			return fmt.Errorf("shadow store: prune rates of %q: %w", r, err)
		}
		if keep == 0 {
			if _, err := s.c().exec(ctx, `DELETE FROM rates WHERE route = ?`, r); err != nil {
				return fmt.Errorf("shadow store: prune rates of %q: %w", r, err)
			}
		}
	}
	return nil
}

// restoreSelect reads only what Accumulator.Add and AddReplicaSimilarity need (no texts):
// per side status … output_tokens and ok … tool_broken, the similarity, whether a baseline
// answered, the loads, the noise-floor samples and the sides' confidence; and the gateway
// that mirrored the pair.
var restoreSelect = func() string {
	var cols []string
	side := func(p string) {
		cols = append(cols, prefixed(p, answerCols[:6])...) // status … output_tokens
		cols = append(cols, prefixed(p, checkCols[:7])...)  // ok … tool_broken
	}
	side("p_")
	side("c_")
	cols = append(cols, "similarity", "b_present")
	side("b_")
	cols = append(cols, "load_primary", "load_baseline", "load_candidate", "noise_similarity", "replica_similarity", "instance")
	for _, p := range []string{"p_", "b_", "c_"} {
		cols = append(cols, prefixed(p, confCols)...)
	}
	return strings.Join(cols, ", ")
}()

// RestoreDepth is how many windows of stored pairs Restore replays. An accumulator keeps
// the last window values of each metric, and a metric that not every pair gives (the
// latencies of failed answers, a failed baseline's noise-floor sample, unmeasured loads)
// reaches back past the last window pairs: replaying RestoreDepth windows rebuilds it
// exactly unless fewer than one pair in RestoreDepth gave it.
const RestoreDepth = 4

// Restore rebuilds acc from the store, so that a verdict survives a restart: it replays the
// newest RestoreDepth×window pairs (and triples) of route and candidate, oldest first,
// through Accumulator.Add, with their noise-floor samples (a triple's primary against its
// baseline through Add, a replica's through AddReplicaSimilarity); when replicas left the
// noise floor short of window samples, older pairs' replica similarities fill it. An
// accumulator of the same window then holds what the live one held (its totals count the
// pairs replayed). candidate "" means the candidate of the route's newest pair. window ≤ 0
// means DefaultWindow. On an error acc may hold part of the pairs.
//
// In a shared store the pairs are every gateway's, ordered by time and then by the order
// the database stored them: the same accumulator whichever gateway restores it.
func (s *Store) Restore(ctx context.Context, route, candidate string, acc *Accumulator, window int) error {
	_, err := s.restore(ctx, s.c(), route, candidate, acc, window)
	return err
}

func (s *Store) restore(ctx context.Context, c conn, route, candidate string, acc *Accumulator, window int) (replayed, error) {
	if acc == nil {
		return replayed{}, errors.New("shadow store: restore: nil accumulator")
	}
	if window <= 0 {
		window = DefaultWindow
	}
	window = min(window, MaxQueryLimit)
	depth := window * RestoreDepth
	if candidate == "" {
		err := c.queryRow(ctx, `SELECT candidate FROM pairs WHERE route = ? ORDER BY ts_ns DESC, id DESC LIMIT 1`, route).Scan(&candidate)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return replayed{}, fmt.Errorf("shadow store: restore %q: %w", route, err)
		}
	}
	n, err := replay(ctx, c, route, candidate, depth, window, acc)
	n.candidate = candidate
	if err != nil {
		return n, fmt.Errorf("shadow store: restore %q: %w", route, err)
	}
	// Replicas are sparse (a fraction of the pairs): the live noise floor may reach back past
	// the pairs replayed. Filling it up to window, no sample is evicted, so the order of
	// these older ones does not matter. (A route with a baseline has none: not searched.)
	if n.rows == depth && (n.replicas > 0 || n.triples == 0) && n.noise < window {
		older, err := olderReplicas(ctx, c, route, candidate, depth, window-n.noise)
		if err != nil {
			return n, fmt.Errorf("shadow store: restore %q noise floor: %w", route, err)
		}
		for _, v := range older {
			acc.AddReplicaSimilarity(v)
		}
	}
	return n, nil
}

// replayed counts what replay added: pairs, triples among them, noise-floor samples, and
// replicas among these; and which gateway instance mirrored each of the newest window
// pairs.
type replayed struct {
	rows, triples, noise, replicas int
	sources                        sourceRing
	candidate                      string // the candidate replayed
}

// maxSources bounds the gateway instances a fleet input names (the others count as
// otherSources).
const (
	maxSources   = 64
	otherSources = "(others)"
)

// sourceRing keeps the instance of the newest window pairs replayed, as indexes into names.
type sourceRing struct {
	names []string
	index map[string]int
	ring  []int
	next  int
	full  bool
}

func newSourceRing(window int) sourceRing {
	return sourceRing{index: map[string]int{}, ring: make([]int, window)}
}

func (r *sourceRing) add(name string) {
	i, ok := r.index[name]
	if !ok {
		if len(r.names) >= maxSources {
			name = otherSources
		}
		if i, ok = r.index[name]; !ok {
			i = len(r.names)
			r.names = append(r.names, name)
			r.index[name] = i
		}
	}
	r.ring[r.next] = i
	if r.next++; r.next == len(r.ring) {
		r.next, r.full = 0, true
	}
}

// counts returns the pairs of each instance in the ring, by name.
func (r *sourceRing) counts() map[string]int {
	n := r.next
	if r.full {
		n = len(r.ring)
	}
	out := map[string]int{}
	for _, i := range r.ring[:n] {
		out[r.names[i]]++
	}
	return out
}

// replay adds the newest depth pairs of route and candidate to acc, oldest first, noting
// the instances of the newest window.
func replay(ctx context.Context, c conn, route, candidate string, depth, window int, acc *Accumulator) (replayed, error) {
	n := replayed{sources: newSourceRing(window)}
	rows, err := c.query(ctx, "SELECT "+restoreSelect+" FROM (SELECT "+restoreSelect+", ts_ns, id FROM pairs"+
		" WHERE route = ? AND candidate = ? ORDER BY ts_ns DESC, id DESC LIMIT ?) AS recent ORDER BY ts_ns, id", route, candidate, depth)
	if err != nil {
		return n, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			pa, ca, ba  answerScan
			pc, cc, bc  checkScan
			sim         sql.NullFloat64
			bPresent    sql.NullBool
			loads       loadScan
			noise, repl sql.NullFloat64
			pcf, bcf    confScan
			ccf         confScan
			source      sql.NullString
		)
		side := func(a *answerScan, c *checkScan) []any {
			return append([]any{&a.status, &a.errClass, &a.ttft, &a.itl, &a.e2e, &a.tokens}, c.dest()[:7]...)
		}
		dest := append(append(side(&pa, &pc), side(&ca, &cc)...), &sim, &bPresent)
		dest = append(append(dest, side(&ba, &bc)...), loads.dest()...)
		dest = append(dest, &noise, &repl, &source)
		dest = append(append(append(dest, pcf.dest()...), bcf.dest()...), ccf.dest()...)
		if err := rows.Scan(dest...); err != nil {
			return n, err
		}
		p, _ := pa.answer() // no tool calls or problems selected: cannot fail
		c, _ := ca.answer()
		p.Confidence, c.Confidence = pcf.confidence(), ccf.confidence()
		ps, _ := pc.side(p)
		cs, _ := cc.side(c)
		r := PairResult{Primary: ps, Candidate: cs, Similarity: sim.Float64, SimilarityValid: sim.Valid, Loads: loads.loads()}
		if bPresent.Bool && bc.ok.Valid {
			b, _ := ba.answer()
			b.Confidence = bcf.confidence()
			bs, _ := bc.side(b)
			r.Baseline = &bs
			r.NoiseSimilarity, r.NoiseValid = noise.Float64, noise.Valid
			n.triples++
		}
		acc.Add(r)
		n.rows++
		n.sources.add(source.String)
		if r.NoiseValid {
			n.noise++
		}
		if repl.Valid {
			acc.AddReplicaSimilarity(repl.Float64)
			n.noise++
			n.replicas++
		}
	}
	return n, rows.Err()
}

// olderReplicas returns, newest first, up to window replica similarities of route and
// candidate's pairs older than the newest skip.
func olderReplicas(ctx context.Context, c conn, route, candidate string, skip, window int) ([]float64, error) {
	rows, err := c.query(ctx, `SELECT replica_similarity FROM pairs
		WHERE route = ? AND candidate = ? AND replica_similarity IS NOT NULL
		AND (ts_ns, id) < (SELECT ts_ns, id FROM pairs WHERE route = ? AND candidate = ? ORDER BY ts_ns DESC, id DESC LIMIT 1 OFFSET ?)
		ORDER BY ts_ns DESC, id DESC LIMIT ?`, route, candidate, route, candidate, skip-1, window)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []float64
	for rows.Next() {
		var v float64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
