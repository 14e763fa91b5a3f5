package proxy

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicegw/sluice/policy/confidence"
)

// confidences returns the serving generation's confidence policies, in route order.
func (st *state) confidences() []plugin[*confidence.Policy] {
	return pluginsOf[*confidence.Policy](st)
}

// confidenceRoutes adds GET /admin/confidence: every confidence policy's params, counters,
// per route and model distributions (entropy, margin, answers' mean entropy) and its last
// low-confidence spans.
func (s *Server) confidenceRoutes(mux *http.ServeMux) {
	mux.Handle("GET /admin/confidence", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		out := []confidence.Snapshot{}
		for _, c := range s.state.Load().confidences() {
			out = append(out, c.p.Snapshot())
		}
		writeJSON(w, http.StatusOK, map[string]any{"policies": out})
	}))
}

// confidenceCollector exports the confidence policies' distributions and counters at scrape
// time, labelled by route, policy and model (all bounded: routes and policies by the config,
// models by the policy's params) and, for answers, by source.
type confidenceCollector struct {
	s                               *Server
	entropy, margin, answerEntropy  *prometheus.Desc
	answers, tokens, noAlts, unsure *prometheus.Desc
	spans, spanned                  *prometheus.Desc
	sampled, stripped               *prometheus.Desc
}

func newConfidenceCollector(s *Server) *confidenceCollector {
	rm := []string{"route", "policy", "model"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("sluice_confidence_"+name, help, labels, nil)
	}
	return &confidenceCollector{s: s,
		entropy:       d("token_entropy_nats", "Entropy of each output token's top-k alternatives, renormalised (nats; a lower bound of the model's)", rm),
		margin:        d("token_margin", "Probability margin between each output token's two most probable alternatives", rm),
		answerEntropy: d("answer_entropy_nats", "Mean token entropy of each answer (choice) that carried logprobs", rm),
		answers:       d("answers_total", "Answers (choices) that carried logprobs, by source: client (asked for them) or sampled (the gateway asked and stripped them)", []string{"route", "policy", "model", "source"}),
		tokens:        d("tokens_total", "Output tokens read with two alternatives or more", rm),
		noAlts:        d("tokens_without_alternatives_total", "Output tokens read with fewer than two alternatives (no entropy or margin)", rm),
		unsure:        d("unsure_tokens_total", "Output tokens above the policy's entropy bound or below its margin bound", rm),
		spans:         d("low_spans_total", "Low-confidence spans: runs of span_tokens unsure tokens or more in a row", rm),
		spanned:       d("low_answers_total", "Answers (choices) with at least one low-confidence span", rm),
		sampled:       d("sampled_total", "Requests the confidence policy asked the upstream logprobs for", []string{"route", "policy"}),
		stripped:      d("stripped_events_total", "Stream events the confidence policy stripped of the logprobs it asked for", []string{"route", "policy"}),
	}
}

func (c *confidenceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.entropy, c.margin, c.answerEntropy, c.answers, c.tokens, c.noAlts, c.unsure, c.spans, c.spanned, c.sampled, c.stripped} {
		ch <- d
	}
}

func (c *confidenceCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		if m, err := prometheus.NewConstMetric(d, prometheus.CounterValue, float64(v), labels...); err == nil {
			ch <- m
		}
	}
	histogram := func(d *prometheus.Desc, h confidence.Histogram, labels ...string) {
		buckets := make(map[float64]uint64, len(h.Bounds))
		var cum uint64
		for i, b := range h.Bounds {
			cum += h.Counts[i]
			buckets[b] = cum
		}
		if m, err := prometheus.NewConstHistogram(d, h.Count, h.Sum, buckets, labels...); err == nil {
			ch <- m
		}
	}
	for _, pl := range c.s.state.Load().confidences() {
		snap := pl.p.Snapshot()
		counter(c.sampled, snap.Sampled, pl.route, pl.name)
		counter(c.stripped, snap.StrippedEvents, pl.route, pl.name)
		for _, se := range snap.Series {
			rm := []string{se.Route, pl.name, se.Model}
			histogram(c.entropy, se.Entropy, rm...)
			histogram(c.margin, se.Margin, rm...)
			histogram(c.answerEntropy, se.AnswerEntropy, rm...)
			for _, src := range []string{confidence.SourceClient, confidence.SourceSampled} {
				counter(c.answers, se.Answers[src], se.Route, pl.name, se.Model, src)
			}
			counter(c.tokens, se.Tokens, rm...)
			counter(c.noAlts, se.TokensWithoutAlternatives, rm...)
			counter(c.unsure, se.UnsureTokens, rm...)
			counter(c.spans, se.Spans, rm...)
			counter(c.spanned, se.AnswersWithSpans, rm...)
		}
	}
}
