package config

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// decoded is a config decoded from YAML, with what is needed to place its problems and to
// tell which of Validate's problems only follow from the decoding's.
type decoded struct {
	config *Config
	// root is the document's top node (nil for an empty document): Validate's problems are
	// placed by looking their paths up in it.
	root *yaml.Node
	// problems are the decoding's: unknown keys, wrong types, bad values, anywhere in the file.
	problems []located
	// fatal: the YAML does not parse; there is nothing to validate.
	fatal bool
	// damaged are the paths whose values were dropped (a bad value, a duplicate key) or are
	// missing because their key was misspelled (`clustr:` for `cluster:`).
	damaged []string
}

// decode decodes YAML strictly into a Config. A document yaml.v3's strict decoder takes is
// decoded by it alone (a valid file loads as it always has). For one it refuses, the node
// tree is walked against the Config's types to find every problem at once (yaml.v3 stops at
// the first bad duration or size, and reports type errors without their paths); the
// entries found bad are removed, and what is left is decoded, for Validate to check.
func decode(data []byte) *decoded {
	sum := sha256.Sum256(data)
	version := hex.EncodeToString(sum[:6])
	d := &decoded{config: &Config{Version: version}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		d.fatal = true
		d.problems = yamlProblems("yaml syntax", err)
		return d
	}
	d.root = documentRoot(&doc)

	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	strictErr := dec.Decode(d.config)
	if strictErr == nil || errors.Is(strictErr, io.EOF) {
		d.config.Version = version
		return d
	}

	d.config = &Config{Version: version}
	w := &walker{seen: map[walked]walkState{}, open: map[*yaml.Node]bool{}, merged: map[walked]bool{}, fields: map[reflect.Type]structFields{}}
	if d.root != nil && !w.walk(d.root, configType, "") {
		d.root = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: d.root.Line, Column: d.root.Column}
	}
	d.problems, d.damaged = w.problems, w.damaged
	if len(d.problems) == 0 || d.root == nil {
		// What the walk does not know (excessive aliasing, say), yaml.v3 still refuses.
		d.problems, d.damaged = yamlProblems("", strictErr), []string{""}
		return d
	}
	// The tree is clean now; decode what is left of it for Validate.
	if err := d.root.Decode(d.config); err != nil {
		d.problems = append(d.problems, yamlProblems("", err)...)
		d.damaged = []string{""}
	}
	d.config.Version = version
	return d
}

// followsFrom reports whether one of Validate's problems only follows from a decoding
// problem: it is about a value that was dropped or misspelled (or about something holding
// one), or it is a reference to a cluster whose name was lost, or a route's need of a cluster
// or split when its splits were damaged. Fixing the decoding problem fixes it, or shows it
// again, alone.
func (d *decoded) followsFrom(problem string) bool {
	p := problemPath(problem)
	for _, dmg := range d.damaged {
		switch {
		case within(p, dmg), p != "" && within(dmg, p):
			return true
		case clusterNamePath.MatchString(dmg) && strings.Contains(problem, "unknown cluster "):
			return true
		}
		if m := routePath.FindString(p); m != "" && within(dmg, m+".splits") &&
			(p == m+".cluster" || p == m+".mirror.progression.split") {
			return true
		}
	}
	return false
}

var (
	clusterNamePath = regexp.MustCompile(`^clusters(\[\d+\](\.name)?)?$`)
	routePath       = regexp.MustCompile(`^routes\[\d+\]`)
)

// within reports whether path p is at or under path at ("" is the whole config).
func within(p, at string) bool {
	if at == "" || p == at {
		return true
	}
	return strings.HasPrefix(p, at) && (p[len(at)] == '.' || p[len(at)] == '[')
}

// yamlProblems turns a yaml.v3 error into problems placed by its "line N:" (what prefix
// says, e.g. "yaml syntax", leads each message).
func yamlProblems(prefix string, err error) []located {
	msgs := []string{err.Error()}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	out := make([]located, 0, len(msgs))
	for _, m := range msgs {
		m = strings.TrimPrefix(m, "yaml: ")
		var pos Position
		if mm := yamlLine.FindStringSubmatch(m); mm != nil {
			pos.Line, _ = strconv.Atoi(mm[1])
			m = m[len(mm[0]):]
		}
		if prefix != "" {
			m = prefix + ": " + m
		}
		out = append(out, located{m, pos})
	}
	return out
}

var yamlLine = regexp.MustCompile(`^line (\d+): `)

var (
	configType          = reflect.TypeFor[Config]()
	unmarshalerType     = reflect.TypeFor[yaml.Unmarshaler]()
	obsoleteUnmarshaler = reflect.TypeFor[interface{ UnmarshalYAML(func(any) error) error }]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	timeType            = reflect.TypeFor[time.Time]()
)

// maxWalk bounds the nodes one walk visits (each anchor's content is walked once per type).
const maxWalk = 1 << 20

// walker checks a YAML node tree against Go types as yaml.v3's strict decoder would, but
// goes on after each problem: it records the problem with its path and place, and removes
// the bad entry from the tree (a bad list item becomes null: the items after it keep their
// indexes, and so Validate's paths).
type walker struct {
	problems []located
	damaged  []string
	seen     map[walked]walkState // anchors' content, walked once per type (and cycles)
	open     map[*yaml.Node]bool  // mappings and lists being checked (cycles)
	merged   map[walked]bool      // mappings merged in, checked
	fields   map[reflect.Type]structFields
	visits   int
	// overBudget: the walk visited maxWalk nodes and stopped.
	overBudget bool
}

type walked struct {
	n *yaml.Node
	t reflect.Type
}

type walkState int

const (
	walking walkState = iota + 1
	walkedGood
	walkedBad
)

func (w *walker) add(n *yaml.Node, path, format string, args ...any) {
	at := path
	if at == "" {
		at = "config"
	}
	w.problems = append(w.problems, located{at + ": " + fmt.Sprintf(format, args...), Position{Line: n.Line, Column: n.Column}})
}

// bad records a problem with the value at path, whose entry is dropped.
func (w *walker) bad(n *yaml.Node, path, format string, args ...any) bool {
	w.add(n, path, format, args...)
	w.damaged = append(w.damaged, path)
	return false
}

// tick counts a visit, and says false past the budget (reported once).
func (w *walker) tick(n *yaml.Node, path string) bool {
	if w.visits++; w.visits <= maxWalk {
		return true
	}
	if !w.overBudget {
		w.overBudget = true
		w.bad(n, path, "the document is too large to check (over %d nodes, aliases expanded)", maxWalk)
	}
	return false
}

// walk checks that n decodes into a t (nil: into an interface, anything goes) and reports
// whether it does; problems inside a mapping or list are recorded and their entries removed,
// and the mapping or list itself still decodes.
func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) bool {
	if !w.tick(n, path) {
		return false
	}
	if n.Kind == yaml.AliasNode {
		return w.alias(n, t, path)
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return true
	}
	for t != nil && t.Kind() == reflect.Pointer && !isLeaf(t) {
		t = t.Elem()
	}
	switch {
	case t == nil || t.Kind() == reflect.Interface:
		return w.anything(n, path)
	case isLeaf(t):
		return w.leaf(n, t, path)
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		if n.Kind != yaml.MappingNode {
			return w.bad(n, path, "expected a mapping, got %s", describe(n))
		}
		return w.mapping(n, t, path)
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return w.bad(n, path, "expected a list, got %s", describe(n))
		}
		return w.list(n, t.Elem(), path)
	}
	return w.leaf(n, t, path)
}

// alias walks what an alias names, once per type however often it is used (and reports a
// cycle, which yaml.v3 refuses).
func (w *walker) alias(n *yaml.Node, t reflect.Type, path string) bool {
	if n.Alias == nil {
		return w.bad(n, path, "unknown anchor %q", n.Value)
	}
	k := walked{n.Alias, t}
	switch w.seen[k] {
	case walking:
		return w.bad(n, path, "anchor %q contains itself", n.Value)
	case walkedGood:
		return true
	case walkedBad:
		w.damaged = append(w.damaged, path)
		return false
	}
	w.seen[k] = walking
	ok := w.walk(n.Alias, t, path)
	w.seen[k] = walkedBad
	if ok {
		w.seen[k] = walkedGood
	}
	return ok
}

// anything checks a value decoded into an interface (a policy's params): only duplicate
// keys are refused there.
func (w *walker) anything(n *yaml.Node, path string) bool {
	switch n.Kind {
	case yaml.MappingNode:
		return w.mapping(n, nil, path)
	case yaml.SequenceNode:
		return w.list(n, nil, path)
	}
	return true
}

// mapping checks a mapping's entries against t (a struct, a map, or nil for an interface):
// duplicate keys, unknown keys, merges and each value. Bad entries are removed.
func (w *walker) mapping(n *yaml.Node, t reflect.Type, path string) bool {
	if !w.enter(n, path) {
		return false
	}
	defer delete(w.open, n)
	field, names := w.keysOf(t)
	keep := make([]bool, len(n.Content)/2)
	present := map[string]bool{}
	type key struct {
		kind  yaml.Kind
		value string
	}
	first := map[key]*yaml.Node{}
	for i := range keep {
		k := n.Content[2*i]
		if k.Kind == yaml.ScalarNode && !isMergeKey(k) {
			present[k.Value] = true
		}
		if pk := first[key{k.Kind, k.Value}]; pk != nil {
			w.bad(k, join(path, k.Value), "duplicate key (first at line %d)", pk.Line)
			continue
		}
		first[key{k.Kind, k.Value}] = k
		keep[i] = true
	}
	for i := range keep {
		k, v := n.Content[2*i], n.Content[2*i+1]
		if !keep[i] {
			continue
		}
		switch {
		case isMergeKey(k):
			keep[i] = w.merge(v, t, path)
		case k.Kind != yaml.ScalarNode:
			w.add(k, path, "expected a key name, got %s", describe(k))
			keep[i] = false
		default:
			kp := join(path, k.Value)
			t, ok := field(k.Value)
			if !ok {
				hint := ""
				if s := suggest(k.Value, names); s != "" {
					hint = fmt.Sprintf(" (did you mean %q?)", s)
					if !present[s] {
						w.damaged = append(w.damaged, join(path, s))
					}
				}
				w.add(k, kp, "unknown key%s", hint)
				keep[i] = false
				continue
			}
			keep[i] = w.walk(v, t, kp)
		}
	}
	content := n.Content[:0]
	for i, ok := range keep {
		if ok {
			content = append(content, n.Content[2*i], n.Content[2*i+1])
		}
	}
	clear(n.Content[len(content):])
	n.Content = content
	return true
}

// enter marks a mapping or list as being checked; false (reported) when it already is: it
// contains itself through an alias, which yaml.v3 refuses.
func (w *walker) enter(n *yaml.Node, path string) bool {
	if w.open[n] {
		return w.bad(n, path, "the value contains itself (through an alias)")
	}
	if !w.tick(n, path) {
		return false
	}
	w.open[n] = true
	return true
}

// list checks a list's items against elem; a bad item becomes null.
func (w *walker) list(n *yaml.Node, elem reflect.Type, path string) bool {
	if !w.enter(n, path) {
		return false
	}
	defer delete(w.open, n)
	for i, item := range n.Content {
		if !w.walk(item, elem, fmt.Sprintf("%s[%d]", path, i)) {
			n.Content[i] = zeroNode(elem, item)
		}
	}
	return true
}

// zeroNode returns a node that decodes into the zero value of t, in place of a bad list
// item: yaml.v3 drops a null item of a struct or scalar type, which would move the items
// after it to other indexes than their problems' paths say.
func zeroNode(t reflect.Type, at *yaml.Node) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: at.Line, Column: at.Column}
	switch {
	case t == nil || t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface:
		return n
	case !isLeaf(t) && (t.Kind() == reflect.Struct || t.Kind() == reflect.Map):
		n.Kind, n.Tag = yaml.MappingNode, "!!map"
		return n
	case !isLeaf(t):
		n.Kind, n.Tag = yaml.SequenceNode, "!!seq"
		return n
	}
	for _, z := range []struct{ tag, value string }{{"!!str", ""}, {"!!int", "0"}, {"!!bool", "false"}, {"!!float", "0"}} {
		c := *n
		c.Tag, c.Value = z.tag, z.value
		if c.Decode(reflect.New(t).Interface()) == nil {
			return &c
		}
	}
	return n
}

// merge checks the value of a merge key (`<<: *defaults`): a mapping or a list of mappings,
// whose entries count as the parent's (of type t). A mapping merged in several places is
// checked once per type.
func (w *walker) merge(v *yaml.Node, t reflect.Type, path string) bool {
	target := unalias(v)
	switch {
	case target != nil && target.Kind == yaml.MappingNode:
		if w.merged[walked{target, t}] {
			return true
		}
		if !w.mapping(target, t, path) {
			w.damaged = append(w.damaged, path)
			return false
		}
		w.merged[walked{target, t}] = true
		return true
	case v.Kind == yaml.SequenceNode:
		for _, item := range v.Content {
			if m := unalias(item); m == nil || m.Kind != yaml.MappingNode {
				return w.bad(item, join(path, "<<"), "a merge needs a mapping or a list of mappings, got %s", describe(item))
			}
		}
		for _, item := range v.Content {
			if !w.merge(item, t, path) {
				return false
			}
		}
		return true
	}
	return w.bad(v, join(path, "<<"), "a merge needs a mapping or a list of mappings, got %s", describe(v))
}

// keysOf says, for the keys of a mapping decoded into t, each key's type (or that it has
// none: an unknown key), and the names to suggest from.
func (w *walker) keysOf(t reflect.Type) (func(string) (reflect.Type, bool), []string) {
	switch {
	case t == nil || t.Kind() == reflect.Interface:
		return func(string) (reflect.Type, bool) { return nil, true }, nil
	case t.Kind() == reflect.Map:
		return func(string) (reflect.Type, bool) { return t.Elem(), true }, nil
	}
	fields, ok := w.fields[t]
	if !ok {
		fields = fieldsOf(t)
		w.fields[t] = fields
	}
	return func(key string) (reflect.Type, bool) {
		f, ok := fields.byName[key]
		if !ok && fields.inlineMap != nil {
			return fields.inlineMap, true
		}
		return f, ok
	}, fields.names
}

// leaf checks a value of a type decoded whole (a scalar, a duration, a size, a time) by
// decoding it.
func (w *walker) leaf(n *yaml.Node, t reflect.Type, path string) bool {
	err := n.Decode(reflect.New(t).Interface())
	if err == nil {
		return true
	}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return w.bad(n, path, "expected %s, got %s", want(t), describe(n))
	}
	msg := yamlLine.ReplaceAllString(strings.TrimPrefix(err.Error(), "yaml: "), "")
	return w.bad(n, path, "%s", msg)
}

// isLeaf reports whether values of t are decoded whole rather than walked into.
func isLeaf(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	if t.Implements(unmarshalerType) || pt.Implements(unmarshalerType) ||
		t.Implements(obsoleteUnmarshaler) || pt.Implements(obsoleteUnmarshaler) {
		return true
	}
	if t.Kind() == reflect.Struct && (t == timeType || pt.Implements(textUnmarshalerType)) {
		return true
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Slice, reflect.Array, reflect.Pointer, reflect.Interface:
		return t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8
	}
	return true
}

// structFields are the YAML keys of a struct type.
type structFields struct {
	byName    map[string]reflect.Type
	names     []string // in field order, for suggestions
	inlineMap reflect.Type
}

func fieldsOf(t reflect.Type) structFields {
	f := structFields{byName: map[string]reflect.Type{}}
	f.add(t)
	return f
}

func (f *structFields) add(t reflect.Type) {
	for i := range t.NumField() {
		sf := t.Field(i)
		if sf.PkgPath != "" && !sf.Anonymous {
			continue
		}
		tag := sf.Tag.Get("yaml")
		if tag == "" && !strings.Contains(string(sf.Tag), ":") {
			tag = string(sf.Tag)
		}
		if tag == "-" {
			continue
		}
		parts := strings.Split(tag, ",")
		inline := false
		for _, p := range parts[1:] {
			inline = inline || p == "inline"
		}
		if inline {
			ft := sf.Type
			switch {
			case ft.Kind() == reflect.Map:
				f.inlineMap = ft.Elem()
			case ft.Kind() == reflect.Struct:
				f.add(ft)
			case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
				f.add(ft.Elem())
			}
			continue
		}
		if sf.PkgPath != "" {
			continue
		}
		name := parts[0]
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		if _, dup := f.byName[name]; !dup {
			f.byName[name] = sf.Type
			f.names = append(f.names, name)
		}
	}
}

// suggest returns the name closest to key, if one is close enough to be a misspelling of it.
func suggest(key string, names []string) string {
	norm := func(s string) string { return strings.ReplaceAll(strings.ToLower(s), "-", "_") }
	best, bestD := "", 0
	for _, n := range names {
		if norm(n) == norm(key) {
			return n
		}
		d := editDistance(key, n)
		if limit := max(1, min(3, len(n)/3)); d <= limit && (best == "" || d < bestD) {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the optimal-string-alignment distance of a and b: insertions, deletions,
// substitutions and swaps of neighbours count one each (bytes; both are short keys).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return max(len(a), len(b))
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// describe names a node's value for a message: `"abc"` for a scalar, "a list", "a mapping".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:37] + "..."
	}
	return strconv.Quote(v)
}

// want names what a type takes, for a message.
func want(t reflect.Type) string {
	if t == timeType {
		return "a timestamp"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "a mapping"
	}
	return "a " + t.String()
}
