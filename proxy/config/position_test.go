package config

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestDecodeProblems: every decoding problem is reported with its path and place, and a
// validation problem is reported too when it is a problem of its own, not when it only
// follows from a decoding problem (the value was dropped, or its key misspelt).
func TestDecodeProblems(t *testing.T) {
	const head = "clusters:\n  - {name: a, endpoints: [{url: \"http://h:1\"}]}\nroutes:\n"
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"misspelt key: no 'required' for the key meant", head + "  - {name: r, clustr: a}\n",
			[]string{`line 4:15: routes[0].clustr: unknown key (did you mean "cluster"?)`}},
		{"unknown key: the missing key is a problem of its own", head + "  - {name: r, frobnicate: a}\n",
			[]string{`line 4: routes[0].cluster: required (or weighted splits)`, `line 4:15: routes[0].frobnicate: unknown key`}},
		{"misspelt key next to the right one", head + "  - {name: r, cluster: x, clustr: a}\n",
			[]string{`line 4: routes[0].cluster: unknown cluster "x"`, `line 4:27: routes[0].clustr: unknown key (did you mean "cluster"?)`}},
		{"wrong type: no 'at least one' for the list dropped", "clusters: 5\nroutes: [{cluster: a}]\n",
			[]string{`line 1:11: clusters: expected a list, got "5"`}},
		{"misspelt top-level key", "cluster:\n  - {name: a, endpoints: [{url: \"http://h:1\"}]}\nroutes: [{cluster: a}]\n",
			[]string{`line 1:1: cluster: unknown key (did you mean "clusters"?)`}},
		{"misspelt cluster name: no unknown cluster where it is named", "clusters:\n  - {nam: a, endpoints: [{url: \"http://h:1\"}]}\nroutes: [{cluster: a}]\n",
			[]string{`line 2:6: clusters[0].nam: unknown key (did you mean "name"?)`}},
		{"a bad list item keeps the indexes after it", head + "  - 5\n  - {name: r, cluster: x}\n",
			[]string{`line 4:5: routes[0]: expected a mapping, got "5"`, `line 5: routes[1].cluster: unknown cluster "x"`}},
		{"a damaged split: no 'cluster required'", head + "  - {name: r, splits: [{cluster: a, weight: x}]}\n",
			[]string{`line 4:45: routes[0].splits[0].weight: expected an integer, got "x"`}},
		{"a damaged field: no problem about its mapping", head + "  - {cluster: a}\ntenants: [{name: t, keys_file: [x]}]\n",
			[]string{`line 5:32: tenants[0].keys_file: expected a string, got a list`}},
		{"duplicate key", head + "  - {name: r, cluster: a, cluster: b}\n",
			[]string{`line 4:27: routes[0].cluster: duplicate key (first at line 4)`}},
		{"bad values of custom types and a validation problem", head + "  - {cluster: a, timeouts: {ttft: [1], idle: 2x}}\nmax_body_bytes: 12XB\nshadow: {window: 3}\n",
			[]string{
				`line 4:35: routes[0].timeouts.ttft: expected a duration like "1s" or "250ms"`,
				`line 4:46: routes[0].timeouts.idle: invalid duration "2x" (use e.g. "1s", "250ms")`,
				`line 5:17: max_body_bytes: invalid size "12X" (use e.g. "16MiB")`,
				`line 6: shadow.window: 3 is too small (at least 8)`,
			}},
		{"wrong scalar types", head + "  - {cluster: a, mirror: {cluster: a, fraction: x}, sticky: session, resume: maybe}\n",
			[]string{
				`line 4: routes[0].mirror.cluster: "a" is the route's own cluster; mirror to a sandbox cluster`,
				`line 4:49: routes[0].mirror.fraction: expected a number, got "x"`,
				`line 4:61: routes[0].sticky: expected a list, got "session"`,
				`line 4:78: routes[0].resume: expected true or false, got "maybe"`,
			}},
		{"a problem in an anchor is reported once", "clusters:\n  - &c {name: a, endpoints: [{url: \"http://h:1\"}], weigth: 2}\n  - {<<: *c, name: b}\nroutes: [{cluster: a}]\n",
			[]string{`line 2:52: clusters[0].weigth: unknown key`}},
		{"a merge in the wrong place", head + "  - {cluster: a, timeouts: {<<: 5}}\n",
			[]string{`line 4:33: routes[0].timeouts.<<: a merge needs a mapping or a list of mappings, got "5"`}},
		{"a cycle", head + "  - {cluster: a, timeouts: &t {<<: *t}}\n",
			[]string{`line 4:28: routes[0].timeouts: the value contains itself (through an alias)`}},
		{"duplicate keys in policy params", head + "  - {cluster: a, policies: [{type: guard, params: {a: 1, a: 2}}]}\n",
			[]string{`line 4:58: routes[0].policies[0].params.a: duplicate key (first at line 4)`}},
		{"not a mapping", "- a\n", []string{`line 1:1: config: expected a mapping, got a list`}},
		{"syntax error", "clusters: [\n", []string{`line 1: yaml syntax: did not find expected node content`}},
		{"validation only: every problem, placed", head + "  - {name: r, cluster: x}\n  - {name: r, cluster: a, match: {path_prefix: v1}}\n",
			[]string{`line 4: routes[0].cluster: unknown cluster "x"`, `line 5: routes[1].name: duplicate route "r"`, `line 5: routes[1].match.path_prefix: must start with /`}},
		{"a missing top-level key has no line", "routes: [{cluster: a}]\n",
			[]string{`line 1: routes[0].cluster: unknown cluster "a"`, `clusters: at least one cluster is required`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Parse = %v, want a *ValidationError", err)
			}
			if got := ve.Located(); !slices.Equal(got, tc.want) {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if len(ve.Positions) != len(ve.Problems) || ve.File != "" {
				t.Errorf("%d positions for %d problems, file %q", len(ve.Positions), len(ve.Problems), ve.File)
			}
		})
	}
}

// TestValidateWithoutYAML: a config built in Go (xDS, flags) is validated as before: every
// problem, no positions, the same message.
func TestValidateWithoutYAML(t *testing.T) {
	c := &Config{Clusters: []Cluster{{Name: "a", Endpoints: []Endpoint{{URL: "http://h:1"}}}}, Routes: []Route{{Name: "r", Cluster: "x"}}}
	err := c.Finish()
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Positions != nil || ve.File != "" {
		t.Fatalf("Finish = %#v", err)
	}
	if want := "invalid config (1 problems):\n  routes[0].cluster: unknown cluster \"x\""; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	if got := ve.Located(); !slices.Equal(got, ve.Problems) {
		t.Errorf("Located() = %q, want the problems as they are", got)
	}
}

const lookupDoc = `listen: 127.0.0.1:8080
defaults: &d
  ttft: 5s
clusters:
  - name: a
    endpoints:
      - url: http://h:1
      - {url: "http://h:2", weight: 2}
routes:
  - &r
    name: r
    cluster: a
    timeouts: {<<: *d, total: 1m}
    mirror:
      set_headers: {x.env: shadow, "a b": c}
  - *r
`

func TestLookup(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(lookupDoc), &doc); err != nil {
		t.Fatal(err)
	}
	root := documentRoot(&doc)
	for _, tc := range []struct {
		path  string
		line  int // 0: nothing found
		exact bool
	}{
		{"listen", 1, true},
		{"clusters", 4, true},
		{"clusters[0]", 5, true},
		{"clusters[0].name", 5, true},
		{"clusters[0].endpoints[1].weight", 8, true},
		{"clusters[0].endpoints[1].metrics", 8, false}, // not in the file: the endpoint's line
		{"clusters[0].endpoints[7].url", 6, false},
		{"clusters[0].health_check.path", 5, false},
		{"routes[0].timeouts.total", 13, true},
		{"routes[0].timeouts.ttft", 3, true}, // merged in from the anchor
		{"routes[0].mirror.set_headers.x.env", 15, true},
		{"routes[0].mirror.set_headers.a b", 15, true},
		{"routes[1]", 16, true},
		{"routes[1].cluster", 12, true}, // through the alias: where the anchor has it,
		{"shadow.window", 0, false},
		{"", 0, false},
		{"routes[", 9, false},
		{"routes[x]", 9, false},
		{"routes[-1]", 9, false},
		{"routes.name", 9, false},
		{"clusters[0]name", 5, false},
		{"listen[0]", 1, false},
	} {
		n, exact := lookup(root, tc.path)
		line := 0
		if n != nil {
			line = n.Line
		}
		if line != tc.line || exact != tc.exact {
			t.Errorf("lookup(%q) = line %d exact %v, want line %d exact %v", tc.path, line, exact, tc.line, tc.exact)
		}
	}
	if n, exact := lookup(nil, "listen"); n != nil || exact {
		t.Errorf("lookup in an empty document found %v", n)
	}
}

// TestLocate places problems found past validation (the gateway's policy builds) in the file.
func TestLocate(t *testing.T) {
	ve := Locate([]byte(lookupDoc), "sluice.yaml", []string{
		`tenants: tenant t: keys_file: x holds no keys`,
		`routes[0].policies[1] (guard): params: json: unknown field "x"`,
		`clusters[0].endpoints[1]: bad`,
	})
	want := []string{
		`sluice.yaml:8: clusters[0].endpoints[1]: bad`,
		`sluice.yaml:10: routes[0].policies[1] (guard): params: json: unknown field "x"`,
		`sluice.yaml: tenants: tenant t: keys_file: x holds no keys`,
	}
	if got := ve.Located(); !slices.Equal(got, want) {
		t.Errorf("Located() =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if ve := Locate([]byte("{"), "x.yaml", []string{"listen: bad"}); ve.Located()[0] != "x.yaml: listen: bad" {
		t.Errorf("a file that does not parse: %q", ve.Located())
	}
}

// FuzzLookup: a problem's path comes from code, the YAML from an operator; no pair may panic
// the lookup, and what it finds exactly is in the document.
func FuzzLookup(f *testing.F) {
	f.Add(lookupDoc, "routes[0].timeouts.ttft")
	f.Add(lookupDoc, "clusters[0].endpoints[1].weight")
	f.Add("a: &a [*a]\n", "a[0][0][0]")
	f.Add("a: &a {<<: *a}\n", "a.b")
	f.Add("a: {<<: [*x]}\n", "a.b")
	f.Add("[1, 2]\n", "[1]")
	f.Add("a: {b.c: 1, b: {c: 2}}\n", "a.b.c")
	f.Fuzz(func(t *testing.T, doc, path string) {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
			return
		}
		found, exact := lookup(documentRoot(&n), path)
		if exact && found == nil {
			t.Fatalf("lookup(%q) exact without a node", path)
		}
		_ = positionOf(documentRoot(&n), path+": x")
	})
}

// FuzzParse: a config is operator input. No content may panic the loader; a rejected one
// has a place (or none) for each problem, within the document; and the loader takes exactly
// what yaml.v3's strict decoder and Validate take, no more and no less.
func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte(lookupDoc))
	f.Add([]byte("clusters: 5\nroutes: [{cluster: a}]\n"))
	f.Add([]byte(minimal + "drain_timeout: soon\ntimeouts: {idel: 1s}\n"))
	f.Add([]byte("a: &a [*a]\n"))
	f.Add([]byte("clusters:\n  - &c {name: a, endpoints: [{url: \"http://h:1\"}]}\n  - {<<: *c, name: b, <<: *c}\nroutes: [{cluster: a}]\n"))
	f.Add([]byte("routes: [{cluster: a, timeouts: &t {<<: *t}}]\n"))
	f.Add([]byte("- 1\n"))
	f.Add([]byte("clusters: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		_, strictErr := strictParse(data, nil)
		if (err == nil) != (strictErr == nil) {
			t.Fatalf("Parse err %v, strict decode and Validate err %v", err, strictErr)
		}
		if err == nil {
			if c == nil {
				t.Fatal("no config and no error")
			}
			return
		}
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("err = %v (%T), want a *ValidationError", err, err)
		}
		if len(ve.Problems) == 0 || len(ve.Positions) != len(ve.Problems) {
			t.Fatalf("%d problems, %d positions", len(ve.Problems), len(ve.Positions))
		}
		lines := 1 // yaml.v3 breaks lines at \n, \r, NEL, LS and PS
		for _, br := range []string{"\n", "\r", "\u0085", "\u2028", "\u2029"} {
			lines += strings.Count(string(data), br)
		}
		for i, p := range ve.Positions {
			if p.Line < 0 || p.Line > lines || p.Column < 0 {
				t.Errorf("problem %q at %v, outside %d lines", ve.Problems[i], p, lines)
			}
		}
	})
}
