package confidence

import "github.com/sluicegw/sluice/policy"

// AdminView is the policy's view in GET /admin/policies (a policy.Viewer): params, sampled
// and stripped counts, per model distributions and the last low-confidence spans.
func (p *Policy) AdminView() any { return p.Snapshot() }

// ReportMetrics exports the distributions and counters (a policy.MetricsReporter), labelled
// by model (bounded by the policy's models and max_models) and, for answers, by source.
func (p *Policy) ReportMetrics(emit func(policy.Sample)) {
	snap := p.Snapshot()
	counter := func(name, help string, v uint64, labels ...[2]string) {
		emit(policy.Sample{Name: "sluice_confidence_" + name, Help: help, Kind: policy.Counter, Value: float64(v), Labels: labels})
	}
	histogram := func(name, help string, h Histogram, labels ...[2]string) {
		emit(policy.Sample{Name: "sluice_confidence_" + name, Help: help, Kind: policy.Histogram,
			Bounds: h.Bounds, Counts: h.Counts, Count: h.Count, Sum: h.Sum, Labels: labels})
	}
	counter("sampled_total", "Requests the confidence policy asked the upstream logprobs for", snap.Sampled)
	counter("stripped_events_total", "Stream events the confidence policy stripped of the logprobs it asked for", snap.StrippedEvents)
	for _, se := range snap.Series {
		m := [2]string{"model", se.Model}
		histogram("token_entropy_nats", "Entropy of each output token's top-k alternatives, renormalised (nats; a lower bound of the model's)", se.Entropy, m)
		histogram("token_margin", "Probability margin between each output token's two most probable alternatives", se.Margin, m)
		histogram("answer_entropy_nats", "Mean token entropy of each answer (choice) that carried logprobs", se.AnswerEntropy, m)
		for _, src := range []string{SourceClient, SourceSampled} {
			counter("answers_total", "Answers (choices) that carried logprobs, by source: client (asked for them) or sampled (the gateway asked and stripped them)",
				se.Answers[src], m, [2]string{"source", src})
		}
		counter("tokens_total", "Output tokens read with two alternatives or more", se.Tokens, m)
		counter("tokens_without_alternatives_total", "Output tokens read with fewer than two alternatives (no entropy or margin)", se.TokensWithoutAlternatives, m)
		counter("unsure_tokens_total", "Output tokens above the policy's entropy bound or below its margin bound", se.UnsureTokens, m)
		counter("low_spans_total", "Low-confidence spans: runs of span_tokens unsure tokens or more in a row", se.Spans, m)
		counter("low_answers_total", "Answers (choices) with at least one low-confidence span", se.AnswersWithSpans, m)
	}
}
