// Package gpu provides the load signals that endpoint picking uses: what the local GPUs report
// through NVML, and what each model server reports on its Prometheus /metrics page.
//
//	Source    local devices: NVML (builds with the nvml tag, cgo and linux; a stub in the
//	          default static build) or Fake
//	Scraper   polls each endpoint's metrics URL, keeps the last good Load per endpoint
//	Loads     Get(endpoint) (Load, bool): the hot-path read, fresh signals only
//
// No GPU, no driver or no cgo is never fatal: an NVML source then reports ErrUnavailable and
// the gateway keeps routing on model-server metrics and its own in-flight counts.
//
// NVML rule: calling any NVML function after a failed Init kills the process (the library's
// symbols are missing), so every call is gated on a successful Init; see nvml.go.
//
// The Scraper understands vLLM's names by default (VLLM); TGI, Triton (TensorRT-LLM) and
// SGLang presets exist, and any server can be described with Names. A name may carry label
// matchers, as in nv_trt_llm_request_metrics{request_type="waiting"}.
//
// Wiring: one Scraper per gateway, its endpoints keyed by the endpoint URL exactly as the
// picker asks for it (Set is called again on every config reload), Start at boot, Close at
// drain. This package only provides data: telemetry exports Snapshot (from an observable-gauge
// callback) and the admin API shows it at /admin/gpu.
//
// Defaults: Interval 250 ms, Timeout 1 s, Staleness 2 s, MaxBody 8 MiB, Names VLLM.
package gpu
