package config

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Position is a place in a YAML config: a line and, where known, a column (both from 1;
// zero when unknown).
type Position struct {
	Line, Column int
}

// String is "14", "22:5", or "" for an unknown position.
func (p Position) String() string {
	switch {
	case p.Line <= 0:
		return ""
	case p.Column <= 0:
		return strconv.Itoa(p.Line)
	default:
		return fmt.Sprintf("%d:%d", p.Line, p.Column)
	}
}

// Located returns the problems, one string each, prefixed with where they are:
// "sluice.yaml:14: routes[0].retry.attempts: …" for a file, "line 14: …" for YAML without
// a file (Parse), the bare problem where there is no position (xDS, flags).
func (e *ValidationError) Located() []string {
	out := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		var at string
		if i < len(e.Positions) {
			at = e.Positions[i].String()
		}
		switch {
		case e.File != "" && at != "":
			out[i] = e.File + ":" + at + ": " + p
		case e.File != "":
			out[i] = e.File + ": " + p
		case at != "":
			out[i] = "line " + at + ": " + p
		default:
			out[i] = p
		}
	}
	return out
}

// located is one problem and where it is.
type located struct {
	problem string
	pos     Position
}

// newValidationError sorts problems by position (those without one last, each group in the
// order found) into a *ValidationError.
func newValidationError(file string, problems []located) *ValidationError {
	problems = slices.Clone(problems)
	slices.SortStableFunc(problems, func(a, b located) int {
		if (a.pos.Line > 0) != (b.pos.Line > 0) {
			if a.pos.Line > 0 {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.pos.Line, b.pos.Line), cmp.Compare(a.pos.Column, b.pos.Column))
	})
	problems = slices.Compact(problems) // an anchor's problem, met again through an alias
	ve := &ValidationError{File: file, Problems: make([]string, len(problems)), Positions: make([]Position, len(problems))}
	for i, p := range problems {
		ve.Problems[i], ve.Positions[i] = p.problem, p.pos
	}
	return ve
}

// Locate places problems found in a config decoded from data (problems that start with a
// config path, like Validate's, or the policy builds' `routes[0].policies[1] (guard): …`) in
// the YAML, as LoadFile does with its own. file names data in the result ("" for none).
func Locate(data []byte, file string, problems []string) *ValidationError {
	var doc yaml.Node
	_ = yaml.Unmarshal(data, &doc) // a file that does not parse places nothing
	root := documentRoot(&doc)
	ls := make([]located, len(problems))
	for i, p := range problems {
		ls[i] = located{p, positionOf(root, p)}
	}
	return newValidationError(file, ls)
}

// documentRoot returns a parsed document's top node, or nil for an empty document.
func documentRoot(doc *yaml.Node) *yaml.Node {
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		return doc.Content[0]
	}
	return nil
}

// positionOf returns the line of the YAML node a problem's path names: the key of a mapping
// entry, the item of a list; the closest existing parent's when the path goes on past what
// the file has (a required key left out); no position for a top-level key the file lacks.
func positionOf(root *yaml.Node, problem string) Position {
	n, _ := lookup(root, problemPath(problem))
	if n == nil {
		return Position{}
	}
	return Position{Line: n.Line}
}

// problemPath returns the config path a problem starts with: `routes[2].cluster` of
// `routes[2].cluster: unknown cluster "x"`, `routes[0].policies[1]` of
// `routes[0].policies[1] (guard): …`.
func problemPath(problem string) string {
	if i := strings.Index(problem, ": "); i >= 0 {
		problem = problem[:i]
	}
	if i := strings.IndexByte(problem, ' '); i >= 0 {
		problem = problem[:i]
	}
	return problem
}

// maxAliasHops bounds how many aliases lookup follows in a row (an alias of an alias …).
const maxAliasHops = 64

// lookup finds the node a config path (`routes[2].cluster`, `clusters[0].endpoints[1]`,
// `routes[0].mirror.set_headers.X-Env`) names under root: for a key, the key's node; for a
// list index, the item. Keys are matched whole, so a map key holding dots or brackets is
// found. Aliases and merge keys (`<<: *defaults`) are followed. When the path goes on past
// what the YAML has, lookup returns the deepest node it found (nil when not even the first
// key is there) and exact false.
func lookup(root *yaml.Node, path string) (found *yaml.Node, exact bool) {
	cur, rest := root, path
	for rest != "" {
		cur = unalias(cur)
		if cur == nil {
			return found, false
		}
		if rest[0] == '[' {
			end := strings.IndexByte(rest, ']')
			if end < 0 || cur.Kind != yaml.SequenceNode {
				return found, false
			}
			i, err := strconv.Atoi(rest[1:end])
			if err != nil || i < 0 || i >= len(cur.Content) {
				return found, false
			}
			found, cur, rest = cur.Content[i], cur.Content[i], rest[end+1:]
			continue
		}
		if found != nil {
			if rest[0] != '.' {
				return found, false
			}
			rest = rest[1:]
		}
		k, v := keyFor(cur, rest, map[*yaml.Node]bool{})
		if k == nil {
			return found, false
		}
		found, cur, rest = k, v, rest[len(k.Value):]
	}
	return found, found != nil
}

// keyFor returns the entry of mapping m whose key begins path (the whole path, or up to a
// '.' or '['), the longest such key when several do; entries merged in with `<<` count,
// after m's own. seen holds the mappings searched already (each is searched once).
func keyFor(m *yaml.Node, path string, seen map[*yaml.Node]bool) (key, value *yaml.Node) {
	if m == nil || m.Kind != yaml.MappingNode || seen[m] {
		return nil, nil
	}
	seen[m] = true
	var merges []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		if k.Kind != yaml.ScalarNode {
			continue
		}
		if isMergeKey(k) {
			merges = append(merges, m.Content[i+1])
			continue
		}
		if !strings.HasPrefix(path, k.Value) || k.Value == "" {
			continue
		}
		if r := path[len(k.Value):]; r != "" && r[0] != '.' && r[0] != '[' {
			continue
		}
		if key == nil || len(k.Value) > len(key.Value) {
			key, value = k, m.Content[i+1]
		}
	}
	if key != nil {
		return key, value
	}
	for _, mg := range merges {
		mg = unalias(mg)
		if mg != nil && mg.Kind == yaml.SequenceNode {
			for _, item := range mg.Content {
				if k, v := keyFor(unalias(item), path, seen); k != nil {
					return k, v
				}
			}
			continue
		}
		if k, v := keyFor(mg, path, seen); k != nil {
			return k, v
		}
	}
	return nil, nil
}

// unalias follows aliases to the node they name (nil for a chain too long or broken).
func unalias(n *yaml.Node) *yaml.Node {
	for range maxAliasHops {
		if n == nil || n.Kind != yaml.AliasNode {
			return n
		}
		n = n.Alias
	}
	return nil
}

// isMergeKey is yaml.v3's test for a merge key (`<<`).
func isMergeKey(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Value == "<<" && (n.Tag == "" || n.Tag == "!" || n.ShortTag() == "!!merge")
}
