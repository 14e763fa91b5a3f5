package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// errNoLoadMetrics is returned when a page has none of the configured metrics.
var errNoLoadMetrics = errors.New("no load metrics on the page")

// ParseLoad reads a Prometheus text exposition (format 0.0.4; OpenMetrics text also works) and
// returns the load it reports under names. Only the lines of the wanted families are parsed,
// so a large page costs little and a malformed line elsewhere does no harm; a malformed
// wanted line, or a page with none of the names, is an error. At is left zero.
func ParseLoad(page []byte, names Names) (Load, error) {
	c, err := names.compile()
	if err != nil {
		return Load{}, err
	}
	l, _, err := parseLoad(page, c, nil)
	return l, err
}

// parseLoad is ParseLoad with compiled names and a scratch buffer for the filtered page
// (reused between scrapes of one endpoint; may be nil). It also says which of the metrics
// the page had (has* bits).
func parseLoad(page []byte, c *compiledNames, scratch *[]byte) (Load, uint8, error) {
	var buf []byte
	if scratch != nil {
		buf = (*scratch)[:0]
	}
	buf = filterFamilies(buf, page, c.families)
	if scratch != nil {
		*scratch = buf
	}
	if len(buf) == 0 {
		return Load{}, 0, errNoLoadMetrics
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(buf))
	if err != nil {
		return Load{}, 0, fmt.Errorf("parse metrics: %w", err)
	}
	var l Load
	var has uint8
	for _, f := range []struct {
		dst  *float64
		sels []selector
		max  bool
		bit  uint8
	}{
		{&l.Waiting, c.waiting, false, hasWaiting}, {&l.Running, c.running, false, hasRunning},
		{&l.KVCacheUsage, c.kv, true, hasKV}, {&l.Throughput, c.throughput, false, hasThroughput},
	} {
		if v, ok := pick(fams, f.sels, f.max); ok {
			*f.dst = v
			has |= f.bit
		}
	}
	if has == 0 {
		return Load{}, 0, errNoLoadMetrics
	}
	return l, has, nil
}

// filterFamilies appends to dst the lines of page that belong to one of families: samples
// and their # HELP and # TYPE lines. Other comments and families are dropped.
func filterFamilies(dst, page []byte, families map[string]struct{}) []byte {
	for len(page) > 0 {
		var line []byte
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			line, page = page, nil
		}
		name := lineFamily(line)
		if name == nil {
			continue
		}
		if _, ok := families[string(name)]; ok {
			dst = append(dst, line...)
			if dst[len(dst)-1] != '\n' {
				dst = append(dst, '\n')
			}
		}
	}
	return dst
}

// lineFamily returns the metric name a line is about, or nil for blank lines and other
// comments.
func lineFamily(line []byte) []byte {
	line = bytes.TrimLeft(line, " \t")
	if len(line) == 0 {
		return nil
	}
	if line[0] == '#' {
		rest := bytes.TrimLeft(line[1:], " \t")
		var ok bool
		if rest, ok = bytes.CutPrefix(rest, []byte("HELP")); !ok {
			if rest, ok = bytes.CutPrefix(rest, []byte("TYPE")); !ok {
				return nil
			}
		}
		rest = bytes.TrimLeft(rest, " \t")
		return rest[:tokenEnd(rest)]
	}
	return line[:tokenEnd(line)]
}

func tokenEnd(b []byte) int {
	for i, c := range b {
		switch c {
		case ' ', '\t', '{', '\n', '\r':
			return i
		}
	}
	return len(b)
}

// pick returns the value of the first selector whose family has a matching series: the sum
// of the series, or their maximum when takeMax is set.
func pick(fams map[string]*dto.MetricFamily, sels []selector, takeMax bool) (float64, bool) {
	for _, sel := range sels {
		f, ok := fams[sel.name]
		if !ok {
			continue
		}
		var v float64
		n := 0
		for _, m := range f.GetMetric() {
			if !matches(m, sel.labels) {
				continue
			}
			x, ok := value(m)
			if !ok {
				continue
			}
			switch {
			case n == 0:
				v = x
			case takeMax:
				v = math.Max(v, x)
			default:
				v += x
			}
			n++
		}
		if n > 0 {
			return v, true
		}
	}
	return 0, false
}

func matches(m *dto.Metric, want []labelPair) bool {
	for _, w := range want {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == w.name {
				found = lp.GetValue() == w.value
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// value reads a gauge, counter or untyped sample; NaN and infinities are skipped.
func value(m *dto.Metric) (float64, bool) {
	var x float64
	switch {
	case m.Gauge != nil:
		x = m.Gauge.GetValue()
	case m.Counter != nil:
		x = m.Counter.GetValue()
	case m.Untyped != nil:
		x = m.Untyped.GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, false
	}
	return x, true
}
