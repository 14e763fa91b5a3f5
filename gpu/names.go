package gpu

import (
	"errors"
	"fmt"
	"strings"
)

// Names says which metrics of a model server's /metrics page give its load. Each list is
// tried in order and the first metric present on the page wins (so an older server's name can
// follow the current one). A name may select series by label, Prometheus style:
//
//	nv_trt_llm_request_metrics{request_type="waiting"}
//
// (label values must not contain commas). Waiting, Running and Throughput add up the matching
// series (for example one per model or per engine); KVCache takes the largest, since it is a
// fraction. Gauges, counters and untyped metrics are read; histograms and summaries are not
// (a histogram's _sum or _count series is read as a metric of that name). A list may be
// empty when a server has no such metric: that field of Load is then 0, and the checks that
// need it do not run (see Checks).
//
// Throughput is a counter that grows with the work the server does, generated tokens with the
// presets; only its rate is used (by the stall check), so its unit does not matter.
type Names struct {
	Waiting    []string `json:"waiting,omitempty"`
	Running    []string `json:"running,omitempty"`
	KVCache    []string `json:"kv_cache,omitempty"`
	Throughput []string `json:"throughput,omitempty"`
}

// Presets for common model servers.
var (
	// VLLM: vLLM v1 names, with the KV-cache name of older servers after the current one.
	VLLM = Names{
		Waiting:    []string{"vllm:num_requests_waiting"},
		Running:    []string{"vllm:num_requests_running"},
		KVCache:    []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		Throughput: []string{"vllm:generation_tokens_total"},
	}
	// TGI: Hugging Face text-generation-inference. TGI reports no KV-cache usage; its
	// generated tokens are a histogram per request, whose _sum grows as requests finish.
	TGI = Names{
		Waiting:    []string{"tgi_queue_size"},
		Running:    []string{"tgi_batch_current_size"},
		Throughput: []string{"tgi_request_generated_tokens_sum"},
	}
	// Triton: Triton Inference Server with the TensorRT-LLM backend (the names the Kubernetes
	// inference extension uses), falling back to Triton's generic pending-request count. No
	// throughput counter: the stall check does not run.
	Triton = Names{
		Waiting: []string{`nv_trt_llm_request_metrics{request_type="waiting"}`, "nv_inference_pending_request_count"},
		Running: []string{`nv_trt_llm_request_metrics{request_type="scheduled"}`},
		KVCache: []string{`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`},
	}
	// SGLang: token_usage is the share of KV-cache tokens in use.
	SGLang = Names{
		Waiting:    []string{"sglang:num_queue_reqs"},
		Running:    []string{"sglang:num_running_reqs"},
		KVCache:    []string{"sglang:token_usage"},
		Throughput: []string{"sglang:generation_tokens_total"},
	}
)

// Preset returns the preset called name ("vllm", "tgi", "triton", "sglang").
func Preset(name string) (Names, bool) {
	switch strings.ToLower(name) {
	case "vllm":
		return VLLM, true
	case "tgi":
		return TGI, true
	case "triton":
		return Triton, true
	case "sglang":
		return SGLang, true
	}
	return Names{}, false
}

// Validate reports every malformed name at once, or nil. Names with no name at all is
// invalid.
func (n Names) Validate() error {
	_, err := n.compile()
	return err
}

// selector is one parsed name: a metric family and the labels its series must carry.
type selector struct {
	name   string
	labels []labelPair
}

type labelPair struct{ name, value string }

// compiledNames is Names parsed once, with the set of family names worth parsing.
type compiledNames struct {
	waiting, running, kv, throughput []selector
	families                         map[string]struct{}
}

func (n Names) compile() (*compiledNames, error) {
	c := &compiledNames{families: map[string]struct{}{}}
	var errs []error
	for _, l := range []struct {
		field string
		in    []string
		out   *[]selector
	}{{"Waiting", n.Waiting, &c.waiting}, {"Running", n.Running, &c.running}, {"KVCache", n.KVCache, &c.kv},
		{"Throughput", n.Throughput, &c.throughput}} {
		for _, s := range l.in {
			sel, err := parseSelector(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("gpu: Names.%s: %w", l.field, err))
				continue
			}
			*l.out = append(*l.out, sel)
			c.families[sel.name] = struct{}{}
		}
	}
	if len(errs) == 0 && len(c.families) == 0 {
		errs = append(errs, errors.New("gpu: Names: no metric names"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// parseSelector parses `name` or `name{label="value",...}` (quotes optional).
func parseSelector(s string) (selector, error) {
	s = strings.TrimSpace(s)
	name, rest, hasLabels := strings.Cut(s, "{")
	name = strings.TrimSpace(name)
	if !validMetricName(name) {
		return selector{}, fmt.Errorf("%q: bad metric name", s)
	}
	sel := selector{name: name}
	if !hasLabels {
		return sel, nil
	}
	inner, ok := strings.CutSuffix(strings.TrimSpace(rest), "}")
	if !ok {
		return selector{}, fmt.Errorf("%q: missing closing brace", s)
	}
	for part := range strings.SplitSeq(inner, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || !validLabelName(k) {
			return selector{}, fmt.Errorf("%q: bad label matcher %q (want label=\"value\")", s, part)
		}
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		sel.labels = append(sel.labels, labelPair{k, v})
	}
	return sel, nil
}

// validMetricName accepts the classic metric-name syntax, colons included.
func validMetricName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r == ':' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func validLabelName(s string) bool {
	return validMetricName(s) && !strings.Contains(s, ":")
}
