package fault

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// KindDrift renames or removes fields of the answer's JSON by path (rename
// "choices[].delta.tool_calls[].function.arguments": "args", remove "usage"), in events and
// in a non-streaming body; the other bytes are kept exactly.
const KindDrift Kind = "drift"

type driftKind struct{}

func (driftKind) kind() Kind       { return KindDrift }
func (driftKind) phase() phase     { return onEvents }
func (driftKind) params() []string { return []string{"rename", "remove"} }

func (driftKind) check(s Spec) (c checker) {
	if len(s.Rename) == 0 && len(s.Remove) == 0 {
		c.add("rename", "a drift needs rename or remove paths")
	}
	for _, path := range sortedKeys(s.Rename) {
		if _, err := parsePath(path); err != nil {
			c.add("rename["+strconv.Quote(path)+"]", "%v", err)
		}
		if n := s.Rename[path]; n == "" || strings.ContainsAny(n, "\"\\\x00\n\r") {
			c.add("rename["+strconv.Quote(path)+"]", "the new name must be non-empty, without quotes, backslashes or line breaks")
		}
	}
	for i, path := range s.Remove {
		if _, err := parsePath(path); err != nil {
			c.add(fmt.Sprintf("remove[%d]", i), "%v", err)
		}
	}
	return c
}

// compile parses the paths once, when the fault is set.
func (driftKind) compile(s *Spec) any {
	d := &drift{}
	for _, k := range sortedKeys(s.Rename) {
		if p, err := parsePath(k); err == nil {
			d.rename = append(d.rename, renameOp{p, s.Rename[k]})
		}
	}
	for _, k := range s.Remove {
		if p, err := parsePath(k); err == nil {
			d.remove = append(d.remove, p)
		}
	}
	return d
}

func (driftKind) event(e *eventStep, st *fstate) bool {
	d, changed := st.a.f.compiled.(*drift).apply(e.payload())
	if changed {
		e.edit(d)
	}
	return changed
}

func (driftKind) body(data []byte, st *fstate) ([]byte, bool) {
	return st.a.f.compiled.(*drift).apply(data)
}

// drift is a compiled drift: paths to rename and to remove.
type drift struct {
	rename []renameOp
	remove [][]seg
}

type renameOp struct {
	path []seg
	to   string
}

// apply returns data with the drift applied, and whether it changed.
func (d *drift) apply(data []byte) ([]byte, bool) {
	changed := false
	for _, r := range d.rename {
		to := r.to
		nd, ch := editPath(data, r.path, func(dst, obj []byte, m member) ([]byte, bool) {
			dst = append(dst, '"')
			dst = append(dst, to...)
			dst = append(dst, '"')
			return append(dst, obj[m.keyEnd:m.end]...), true
		})
		data, changed = nd, changed || ch
	}
	for _, p := range d.remove {
		nd, ch := editPath(data, p, removeLeaf)
		data, changed = nd, changed || ch
	}
	return data, changed
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
