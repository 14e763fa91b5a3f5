package fault

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/sluicegw/sluice/policy"
)

// Header is the request header that asks for faults on one request. The gateway honours it
// only when chaos is enabled and the request carries the admin token (HeaderToken) or comes
// from an allowed network.
const (
	Header      = "x-sluice-fault"
	HeaderToken = "x-sluice-admin-token"
)

// Bounds of the header.
const (
	maxHeaderLen    = 4096
	maxHeaderFaults = 16
)

// headerParams maps a header parameter to the Spec field it sets.
var headerParams = map[string]func(s *Spec, v string) error{
	"side":         func(s *Spec, v string) error { s.Side = Side(v); return nil },
	"percent":      func(s *Spec, v string) error { f, err := parseFloat(v); s.Percent = &f; return err },
	"cluster":      func(s *Spec, v string) error { s.Cluster = v; return nil },
	"attempts":     func(s *Spec, v string) error { return parseInt(v, &s.Attempts) },
	"status":       func(s *Spec, v string) error { return parseInt(v, &s.Status) },
	"retry_after":  func(s *Spec, v string) error { return parseDur(v, &s.RetryAfter) },
	"message":      func(s *Spec, v string) error { s.Message = v; return nil },
	"for":          func(s *Spec, v string) error { return parseDur(v, &s.For) },
	"shape":        func(s *Spec, v string) error { f, err := parseFloat(v); s.Shape = f; return err },
	"scale":        func(s *Spec, v string) error { return parseDur(v, &s.Scale) },
	"gap":          func(s *Spec, v string) error { return parseDur(v, &s.Gap) },
	"jitter":       func(s *Spec, v string) error { return parseDur(v, &s.Jitter) },
	"after":        func(s *Spec, v string) error { return parseInt(v, &s.AfterEvents) },
	"after_events": func(s *Spec, v string) error { return parseInt(v, &s.AfterEvents) },
	"after_tokens": func(s *Spec, v string) error { return parseInt(v, &s.AfterTokens) },
	"at":           func(s *Spec, v string) error { return parseInt(v, &s.At) },
	"mode":         func(s *Spec, v string) error { s.Mode = v; return nil },
	"rate":         func(s *Spec, v string) error { f, err := parseFloat(v); s.Rate = f; return err },
	"seed": func(s *Spec, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("invalid integer %q", v)
		}
		s.Seed = n
		return nil
	},
	"rename": func(s *Spec, v string) error {
		path, to, ok := strings.Cut(v, ":")
		if !ok {
			return fmt.Errorf("rename takes path:new_name, not %q", v)
		}
		if s.Rename == nil {
			s.Rename = map[string]string{}
		}
		s.Rename[strings.TrimSpace(path)] = strings.TrimSpace(to)
		return nil
	},
	"remove": func(s *Spec, v string) error { s.Remove = append(s.Remove, v); return nil },
}

// ParseHeader parses the x-sluice-fault header: faults separated by ';', each a kind with
// optional parameters in parentheses, separated by ',':
//
//	stall(after=10,for=2s); cut(after=20,mode=eof)
//	abort(status=429,retry_after=2s)   delay(shape=2.1,scale=120ms)   drop(usage)
//	drift(rename=choices[].delta.content:text,remove=usage)
//
// A parameter without '=' is the mode (cut(after=3,reset), drop(done)); after is
// after_events; rename and remove may repeat. The keys are those of Spec, except the ones
// that make no sense for one request (id, every, route, model, start, duration,
// max_active). A header fault fires on the request unless its percent says otherwise. The
// error names every problem.
func ParseHeader(v string) ([]Spec, error) {
	if len(v) > maxHeaderLen {
		return nil, fmt.Errorf("%s: longer than %d bytes", Header, maxHeaderLen)
	}
	var out []Spec
	var p Problems
	for i, part := range strings.Split(v, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if len(out) == maxHeaderFaults {
			p = append(p, fmt.Sprintf("%s: more than %d faults", Header, maxHeaderFaults))
			break
		}
		at := fmt.Sprintf("%s fault %d", Header, i+1)
		kind, args, hasArgs := strings.Cut(part, "(")
		kind = strings.TrimSpace(kind)
		s := Spec{Kind: Kind(kind)}
		at += " (" + kind + ")"
		if hasArgs {
			body, ok := strings.CutSuffix(strings.TrimSpace(args), ")")
			if !ok || strings.ContainsAny(body, "()") {
				p = append(p, at+": unbalanced parentheses")
				out = append(out, s)
				continue
			}
			for _, kv := range strings.Split(body, ",") {
				kv = strings.TrimSpace(kv)
				if kv == "" {
					continue
				}
				key, val, ok := strings.Cut(kv, "=")
				key, val = strings.TrimSpace(key), strings.TrimSpace(val)
				if !ok {
					key, val = "mode", key
				}
				set := headerParams[key]
				if set == nil {
					p = append(p, fmt.Sprintf("%s: unknown parameter %q (known: %s)", at, key, headerKeys()))
					continue
				}
				if err := set(&s, val); err != nil {
					p = append(p, fmt.Sprintf("%s: %s: %v", at, key, err))
				}
			}
		}
		p = append(p, s.problems(at+": ")...)
		out = append(out, s)
	}
	if len(p) > 0 {
		return nil, p
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no fault", Header)
	}
	return out, nil
}

func headerKeys() string {
	keys := make([]string, 0, len(headerParams))
	for k := range headerParams {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}

func parseInt(v string, dst *int) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("invalid integer %q", v)
	}
	*dst = n
	return nil
}

func parseFloat(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid number %q", v)
	}
	return f, nil
}

func parseDur(v string, dst *Duration) error {
	d, err := policy.ParseDuration(v)
	*dst = Duration(d)
	return err
}
