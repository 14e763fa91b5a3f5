// Package gpu provides the load signals that endpoint picking uses: what the local GPUs report
// through NVML, and what each model server reports on its Prometheus /metrics page.
//
//	Source    local devices: NVML (builds with the nvml tag, cgo and linux; a stub in the
//	          default static build) or Fake
//	Scraper   polls each endpoint's metrics URL, keeps the last good Load per endpoint, and
//	          runs the state checks (Checks) on each one: Load.Flags
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
// State checks (Checks, on by default): a KV-cache leak (KV use held with nothing running or
// waiting, LeakCheck) and a stall (a queue that grows while throughput, the rate of the
// Names.Throughput counter, falls: StallCheck). They run on every good scrape over a fixed
// history of 16 samples per endpoint (historySize: fast scrapes merge into the newest sample,
// so it spans the stall window whatever the interval), set Load.Flags, show in Snapshot
// (EndpointStatus.Checks) and log entering and leaving a flag on Logger. Picking reads the
// flags with the load (package upstream: a lower weight, optionally ejection).
//
// Poll scrapes every endpoint once, synchronously: for callers that drive scraping themselves
// (tests on an injected Clock).
//
// Wiring: one Scraper per gateway, its endpoints keyed by the endpoint URL exactly as the
// picker asks for it (Set is called again on every config reload), Start at boot, Close at
// drain. This package only provides data: telemetry exports Snapshot (from an observable-gauge
// callback) and the admin API shows it at /admin/gpu.
//
// Defaults: Interval 250 ms, Timeout 1 s, Staleness 2 s, MaxBody 8 MiB, Names VLLM; checks:
// leak at 10% KV use for 5 min (cleared below 5%), stall over 30 s with a queue of 2 and
// throughput halved.
package gpu
