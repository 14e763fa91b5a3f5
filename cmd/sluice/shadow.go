package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// maxReportBytes bounds a report fetched from the admin API.
const maxReportBytes = 64 << 20

func runShadow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub := ""
	if len(args) > 0 {
		sub = args[0]
	}
	switch sub {
	case "report":
		return runShadowReport(ctx, args[1:], stdout, stderr)
	case "export":
		return runShadowExport(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stderr, shadowUsage)
		return flag.ErrHelp
	case "":
		fmt.Fprint(stderr, shadowUsage)
		return errors.New("give a subcommand: report or export")
	}
	fmt.Fprint(stderr, shadowUsage)
	return fmt.Errorf("unknown subcommand %q (want report or export)", sub)
}

const shadowUsage = `usage: sluice shadow report [--admin URL] [--token-env NAME] [--json] [--judge] [--html FILE]
       sluice shadow report --store FILE|URL [--route R] [--window N] [--json] [--html FILE]
       sluice shadow export [--admin URL] [--token-env NAME] [--route R] [--limit N] [--out FILE]
       sluice shadow export --store FILE|URL [--route R] [--limit N] [--out FILE]

Shadow traffic: the candidate's answers to mirrored requests compared with its reference's:
the baseline's (the primary's version in a sandbox, asked at the same moment) when the route
has one, else the primary's. 'report' prints each mirrored route's verdict (promote, hold or
rollback), the mirror's counters per side, the per-metric tests (reference, test, n, effect,
p; paired latencies as a ratio with its interval), the loads, the latency distributions of
the primary, baseline and candidate side by side, the similarity against the noise floor,
the verdict history and recent pair problems. It asks a running gateway (GET /admin/shadow.json)
or, with --store, reads the store offline (the window of pairs is rebuilt from it): a SQLite
file, or the postgres:// URL of a store a fleet shares (judged over every replica's pairs).
'export' writes stored pairs, redacted, as JSON lines (oldest first) that 'sluice load
--trace FILE' can replay against a sandbox.

Run 'sluice shadow report --help' or 'sluice shadow export --help' for the flags.
`

// adminFlags are the flags shared by the subcommands that talk to a gateway.
type adminFlags struct {
	admin, tokenEnv, store, route string
	timeout                       time.Duration
}

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.admin, "admin", "http://127.0.0.1:9090", "base URL of the gateway's admin listener")
	fs.StringVar(&a.tokenEnv, "token-env", "SLUICE_ADMIN_TOKEN", "environment variable holding the admin bearer token (sent when set)")
	fs.StringVar(&a.store, "store", "", "read this shadow store directly instead of asking a gateway: the SQLite file or postgres:// URL of shadow.store in the config (read-only)")
	fs.StringVar(&a.route, "route", "", "only this route (default: every route)")
	fs.DurationVar(&a.timeout, "timeout", 30*time.Second, "bound on the request to the admin API")
}

func runShadowReport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shadow report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var af adminFlags
	af.register(fs)
	asJSON := fs.Bool("json", false, "print the report as JSON (what /admin/shadow.json serves)")
	judge := fs.Bool("judge", false, "ask the gateway to judge every mirrored route now (POST /admin/shadow/judge)")
	htmlOut := fs.String("html", "", "also write the self-contained HTML report to this file")
	window := fs.Int("window", config.DefaultShadowWindow, "with --store: pairs per route the offline verdict window holds (the gateway's shadow.window)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), shadowUsage+"\nFlags of report:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *window < 1 || *window > shadow.MaxQueryLimit {
		return fmt.Errorf("--window %d: want 1..%d", *window, shadow.MaxQueryLimit)
	}
	var rep shadow.Report
	if af.store != "" {
		if *judge {
			return errors.New("--judge asks a running gateway; it does not apply with --store")
		}
		st, err := openExistingStore(ctx, af.store)
		if err != nil {
			return err
		}
		defer st.Close()
		var ins []shadow.RouteInput
		if af.route != "" {
			ins = []shadow.RouteInput{{Route: af.route, Window: *window}}
		} else {
			routes, err := st.Routes(ctx)
			if err != nil {
				return err
			}
			for _, r := range routes {
				ins = append(ins, shadow.RouteInput{Route: r, Window: *window})
			}
		}
		if ins == nil {
			ins = []shadow.RouteInput{}
		}
		if rep, err = shadow.BuildReport(ctx, st, ins); err != nil {
			return err
		}
		rep.Store = &shadow.StoreStatus{Kind: st.Kind(), Location: st.Path(), Shared: st.Shared()}
	} else {
		method, path := http.MethodGet, "/admin/shadow.json"
		if *judge {
			method, path = http.MethodPost, "/admin/shadow/judge"
		}
		body, err := adminCall(ctx, af, method, path)
		if err != nil {
			return err
		}
		defer body.Close()
		raw, err := io.ReadAll(io.LimitReader(body, maxReportBytes+1))
		if err != nil {
			return fmt.Errorf("reading the report from %s: %w", af.admin, err)
		}
		if len(raw) > maxReportBytes {
			return fmt.Errorf("the report from %s is larger than %d bytes", af.admin, maxReportBytes)
		}
		if err := json.Unmarshal(raw, &rep); err != nil {
			return fmt.Errorf("the answer of %s%s is not a shadow report: %w", af.admin, path, err)
		}
		if af.route != "" {
			kept := rep.Routes[:0]
			for _, r := range rep.Routes {
				if r.Route == af.route {
					kept = append(kept, r)
				}
			}
			rep.Routes = kept
		}
	}
	if af.route != "" && len(rep.Routes) == 0 {
		return fmt.Errorf("no shadow data for route %q", af.route)
	}
	if *htmlOut != "" {
		if err := writeFile(*htmlOut, rep.WriteHTML); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteText(stdout)
}

func runShadowExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shadow export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var af adminFlags
	af.register(fs)
	limit := fs.Int("limit", 1000, "newest pairs per route to export")
	out := fs.String("out", "", "write the JSON lines to this file (default: standard output)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), shadowUsage+`
Each line is one pair: {"route","ts","request_id","session","endpoint","request":<the redacted
request body>,"primary":{status,error_class,ttft_ms,itl_ms,e2e_ms,output_tokens,finish_reason,
text,tool_calls,problems},"candidate":{…},"replica":{…},"similarity","replica_similarity","notes"}.
Replay it with: sluice load --target URL --trace pairs.jsonl

Flags of export:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *limit < 1 || *limit > shadow.MaxQueryLimit {
		return fmt.Errorf("--limit %d: want 1..%d", *limit, shadow.MaxQueryLimit)
	}
	w := stdout
	var f *os.File
	if *out != "" {
		var err error
		if f, err = os.Create(*out); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		defer f.Close()
		w = f
	}
	n := 0
	if af.store != "" {
		st, err := openExistingStore(ctx, af.store)
		if err != nil {
			return err
		}
		defer st.Close()
		routes := []string{af.route}
		if af.route == "" {
			if routes, err = st.Routes(ctx); err != nil {
				return err
			}
		}
		var pairs []shadow.PairRecord
		for _, r := range routes {
			ps, err := st.Pairs(ctx, r, *limit)
			if err != nil {
				return err
			}
			pairs = append(pairs, ps...)
		}
		shadow.SortOldestFirst(pairs)
		if err := shadow.ExportJSONL(ctx, w, pairs); err != nil {
			return err
		}
		n = len(pairs)
	} else {
		q := url.Values{"limit": {strconv.Itoa(*limit)}}
		if af.route != "" {
			q.Set("route", af.route)
		}
		body, err := adminCall(ctx, af, http.MethodGet, "/admin/shadow/export?"+q.Encode())
		if err != nil {
			return err
		}
		defer body.Close()
		cw := &countingWriter{w: w}
		if _, err := io.Copy(cw, body); err != nil {
			return fmt.Errorf("reading the export from %s: %w", af.admin, err)
		}
		n = cw.lines
	}
	if f != nil {
		if err := f.Close(); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
	}
	fmt.Fprintf(stderr, "exported %d pairs\n", n)
	return nil
}

type countingWriter struct {
	w     io.Writer
	lines int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.lines += bytes.Count(p, []byte{'\n'})
	return c.w.Write(p)
}

// openExistingStore opens a store file for reading, refusing to create one (a mistyped
// path would otherwise give an empty report), or a PostgreSQL store (its URL) read-only.
func openExistingStore(ctx context.Context, path string) (*shadow.Store, error) {
	if shadow.IsPostgresURL(path) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		st, err := shadow.OpenStoreReadOnly(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("--store: %w", err)
		}
		return st, nil
	}
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("--store %s: no such file (the path is shadow.store in the gateway's config)", path)
		}
		return nil, fmt.Errorf("--store: %w", err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("--store %s is a directory; give the SQLite file", path)
	}
	// Read only: the gateway may be writing it, and a report must not migrate or create.
	return shadow.OpenStoreReadOnly(ctx, path)
}

// adminCall sends one request to the admin API and returns the body of a 200 answer;
// other answers become errors that say what to do. Closing the body releases everything.
func adminCall(ctx context.Context, af adminFlags, method, path string) (io.ReadCloser, error) {
	base := strings.TrimRight(af.admin, "/")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--admin %q: give the admin listener's URL with its scheme, e.g. http://127.0.0.1:9090", af.admin)
	}
	ctx, cancel := context.WithTimeout(ctx, af.timeout)
	req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("--admin: %w", err)
	}
	token := ""
	if af.tokenEnv != "" {
		token = os.Getenv(af.tokenEnv)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment}
	client := &http.Client{Transport: tr}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		tr.CloseIdleConnections()
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("cannot reach the admin API at %s (is 'sluice serve' running with admin.listen there? give --admin): %w", base, err)
		}
		return nil, fmt.Errorf("admin API at %s: %w", base, err)
	}
	if resp.StatusCode == http.StatusOK {
		return &closer{ReadCloser: resp.Body, done: func() { cancel(); tr.CloseIdleConnections() }}, nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	cancel()
	tr.CloseIdleConnections()
	detail := errorMessage(msg)
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		if token == "" {
			return nil, fmt.Errorf("admin API at %s wants a bearer token: set $%s (or name another variable with --token-env)", base, af.tokenEnv)
		}
		return nil, fmt.Errorf("admin API at %s refused the token in $%s: %s", base, af.tokenEnv, detail)
	case http.StatusNotFound:
		if detail != "" && !strings.Contains(detail, "404 page not found") {
			return nil, fmt.Errorf("admin API at %s: %s", base, detail)
		}
		return nil, fmt.Errorf("admin API at %s has no %s (a gateway without shadow support, or not Sluice's admin listener)", base, strings.SplitN(path, "?", 2)[0])
	}
	return nil, fmt.Errorf("admin API at %s%s: %s: %s", base, strings.SplitN(path, "?", 2)[0], resp.Status, detail)
}

type closer struct {
	io.ReadCloser
	done func()
}

func (c *closer) Close() error {
	err := c.ReadCloser.Close()
	c.done()
	return err
}

// errorMessage pulls error.message out of an OpenAI error body (else the body, trimmed).
func errorMessage(b []byte) string {
	var v struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &v) == nil && v.Error.Message != "" {
		return v.Error.Message
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}
