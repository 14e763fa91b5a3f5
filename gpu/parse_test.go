package gpu

import (
	"strings"
	"testing"
)

func TestParseLoad(t *testing.T) {
	tests := []struct {
		name  string
		names Names
		page  string
		want  Load
		err   string // substring; "" means no error
	}{
		{name: "vllm current names", names: VLLM, page: vllmPage, want: Load{Waiting: 3, Running: 5, KVCacheUsage: 0.42}},
		{name: "vllm old kv name", names: VLLM, page: `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 1
vllm:num_requests_running{model_name="m"} 2
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
`, want: Load{Waiting: 1, Running: 2, KVCacheUsage: 0.25}},
		{name: "current kv name wins over old", names: VLLM, page: `vllm:gpu_cache_usage_perc{model_name="m"} 0.9
vllm:kv_cache_usage_perc{model_name="m"} 0.1
`, want: Load{KVCacheUsage: 0.1}},
		{name: "label sets summed, kv max", names: VLLM, page: `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a",engine="0"} 2
vllm:num_requests_waiting{model_name="a",engine="1"} 3
vllm:num_requests_running{model_name="a",engine="0"} 1
vllm:num_requests_running{model_name="a",engine="1"} 4
vllm:kv_cache_usage_perc{model_name="a",engine="0"} 0.3
vllm:kv_cache_usage_perc{model_name="a",engine="1"} 0.7
`, want: Load{Waiting: 5, Running: 5, KVCacheUsage: 0.7}},
		{name: "no labels, untyped, no trailing newline", names: VLLM, page: "vllm:num_requests_waiting 7\nvllm:num_requests_running 8",
			want: Load{Waiting: 7, Running: 8}},
		{name: "openmetrics text", names: VLLM, page: `# TYPE vllm:num_requests_waiting gauge
# UNIT vllm:num_requests_waiting requests
vllm:num_requests_waiting{model_name="m"} 4
# EOF
`, want: Load{Waiting: 4}},
		{name: "malformed lines of other families are ignored", names: VLLM, page: "this is { not prometheus\nfoo{a=\"b\" 1\n" + vllmPage,
			want: Load{Waiting: 3, Running: 5, KVCacheUsage: 0.42}},
		{name: "tgi", names: TGI, page: `# TYPE tgi_queue_size gauge
tgi_queue_size 6
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 4096
`, want: Load{Waiting: 6, Running: 12}},
		{name: "triton trt-llm", names: Triton, page: `# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="ensemble",request_type="waiting",version="1"} 9
nv_trt_llm_request_metrics{model="ensemble",request_type="scheduled",version="1"} 4
nv_trt_llm_request_metrics{model="ensemble",request_type="active",version="1"} 13
nv_trt_llm_request_metrics{model="ensemble",request_type="max",version="1"} 64
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="ensemble",version="1"} 0.55
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="ensemble",version="1"} 550
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ensemble",version="1"} 99
`, want: Load{Waiting: 9, Running: 4, KVCacheUsage: 0.55}},
		{name: "triton generic pending count", names: Triton, page: `# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="a",version="1"} 2
nv_inference_pending_request_count{model="b",version="1"} 5
`, want: Load{Waiting: 7}},
		{name: "sglang", names: SGLang, page: `sglang:num_queue_reqs{model_name="m"} 1
sglang:num_running_reqs{model_name="m"} 2
sglang:token_usage{model_name="m"} 0.5
`, want: Load{Waiting: 1, Running: 2, KVCacheUsage: 0.5}},
		{name: "vllm throughput counter", names: VLLM, page: vllmPage + `# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 12345
`, want: Load{Waiting: 3, Running: 5, KVCacheUsage: 0.42, Throughput: 12345}},
		{name: "tgi generated tokens: a histogram's sum", names: TGI, page: `tgi_queue_size 1
tgi_batch_current_size 2
# HELP tgi_request_generated_tokens Generated tokens per request
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="1"} 0
tgi_request_generated_tokens_bucket{le="+Inf"} 7
tgi_request_generated_tokens_sum 900
tgi_request_generated_tokens_count 7
`, want: Load{Waiting: 1, Running: 2, Throughput: 900}},
		{name: "sglang throughput summed over ranks", names: SGLang, page: `sglang:num_queue_reqs{model_name="m"} 0
sglang:generation_tokens_total{model_name="m",tp_rank="0"} 100
sglang:generation_tokens_total{model_name="m",tp_rank="1"} 50
`, want: Load{Throughput: 150}},
		{name: "throughput alone is a load", names: VLLM, page: "vllm:generation_tokens_total 5\n", want: Load{Throughput: 5}},
		{name: "NaN sample skipped", names: VLLM, page: "vllm:num_requests_waiting{a=\"1\"} NaN\nvllm:num_requests_waiting{a=\"2\"} 2\n",
			want: Load{Waiting: 2}},
		{name: "malformed wanted line", names: VLLM, page: "vllm:num_requests_waiting{model_name=\"m\" 3\n", err: "parse metrics"},
		{name: "bad value", names: VLLM, page: "vllm:num_requests_waiting{model_name=\"m\"} three\n", err: "parse metrics"},
		{name: "empty page", names: VLLM, page: "", err: "no load metrics"},
		{name: "html page", names: VLLM, page: "<html><body>Not Found</body></html>\n", err: "no load metrics"},
		{name: "other server's names", names: TGI, page: vllmPage, err: "no load metrics"},
		{name: "histogram is not a load", names: Names{Waiting: []string{"vllm:time_to_first_token_seconds"}}, page: vllmPage, err: "no load metrics"},
		{name: "label matcher matches nothing", names: Names{Waiting: []string{`vllm:num_requests_waiting{model_name="other"}`}}, page: vllmPage, err: "no load metrics"},
		{name: "bad names", names: Names{Waiting: []string{"1bad"}}, page: vllmPage, err: "bad metric name"},
		{name: "no names", names: Names{}, page: vllmPage, err: "no metric names"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLoad([]byte(tc.page), tc.names)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q (load %+v)", err, tc.err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestParseLoadPresence: the checks are told which metrics the page had, not only values.
func TestParseLoadPresence(t *testing.T) {
	c, err := VLLM.compile()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		page string
		has  uint8
	}{
		{vllmPage, hasWaiting | hasRunning | hasKV},
		{vllmPage + "vllm:generation_tokens_total 0\n", hasWaiting | hasRunning | hasKV | hasThroughput},
		{"vllm:num_requests_waiting 0\n", hasWaiting},
		{"vllm:num_requests_running 0\nvllm:gpu_cache_usage_perc 0\n", hasRunning | hasKV},
	} {
		_, has, err := parseLoad([]byte(tc.page), c, nil)
		if err != nil || has != tc.has {
			t.Errorf("page %q: has %04b, %v; want %04b", tc.page, has, err, tc.has)
		}
	}
}

// FuzzParseLoad: no page makes the parser panic, and a load it returns holds numbers only
// (no NaN or infinity: such samples are skipped).
func FuzzParseLoad(f *testing.F) {
	f.Add([]byte(vllmPage))
	f.Add([]byte(vllmPage + "vllm:generation_tokens_total{model_name=\"m\"} 1e3\n"))
	f.Add([]byte("tgi_request_generated_tokens_sum 9\ntgi_queue_size 1\n"))
	f.Add([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{a=\"b\"} NaN\n"))
	f.Add([]byte("vllm:kv_cache_usage_perc{x=\"\\\"\"} +Inf\n# EOF\n"))
	f.Add([]byte("\x00\xff{{{\n#\n# TYPE\n"))
	names := []Names{VLLM, TGI, SGLang, Triton}
	f.Fuzz(func(t *testing.T, page []byte) {
		for _, n := range names {
			l, err := ParseLoad(page, n)
			if err != nil {
				continue
			}
			for _, v := range []float64{l.Waiting, l.Running, l.KVCacheUsage, l.Throughput} {
				if v != v || v > 1e308 || v < -1e308 {
					t.Fatalf("%+v from %q", l, page)
				}
			}
		}
	})
}

func TestParseSelector(t *testing.T) {
	tests := []struct {
		in   string
		want selector
		err  bool
	}{
		{in: "vllm:num_requests_waiting", want: selector{name: "vllm:num_requests_waiting"}},
		{in: ` m{a="x", b=y} `, want: selector{name: "m", labels: []labelPair{{"a", "x"}, {"b", "y"}}}},
		{in: "m{}", want: selector{name: "m"}},
		{in: "", err: true},
		{in: "m{a=\"x\"", err: true},
		{in: "m{a}", err: true},
		{in: "m{a:b=\"x\"}", err: true},
		{in: "has space", err: true},
	}
	for _, tc := range tests {
		got, err := parseSelector(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("parseSelector(%q) err = %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if err == nil && (got.name != tc.want.name || len(got.labels) != len(tc.want.labels)) {
			t.Errorf("parseSelector(%q) = %+v, want %+v", tc.in, got, tc.want)
			continue
		}
		for i := range got.labels {
			if got.labels[i] != tc.want.labels[i] {
				t.Errorf("parseSelector(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		}
	}
}

func TestNamesValidateAndPresets(t *testing.T) {
	for _, p := range []string{"vllm", "TGI", "triton", "sglang"} {
		n, ok := Preset(p)
		if !ok {
			t.Fatalf("Preset(%q) missing", p)
		}
		if err := n.Validate(); err != nil {
			t.Errorf("preset %s: %v", p, err)
		}
	}
	if _, ok := Preset("nope"); ok {
		t.Error("Preset(nope) found")
	}
	err := Names{Waiting: []string{"a b"}, KVCache: []string{"x{"}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "Waiting") || !strings.Contains(err.Error(), "KVCache") {
		t.Errorf("Validate = %v, want both problems listed", err)
	}
}

func BenchmarkParseVLLMPage(b *testing.B) {
	page := []byte(strings.Repeat("# HELP other_metric_seconds x\n# TYPE other_metric_seconds histogram\nother_metric_seconds_bucket{le=\"0.1\",model_name=\"m\"} 3\n", 300) + vllmPage)
	c, err := VLLM.compile()
	if err != nil {
		b.Fatal(err)
	}
	var scratch []byte
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := parseLoad(page, c, &scratch); err != nil {
			b.Fatal(err)
		}
	}
}
