package gpu

import (
	"context"
	"errors"
	"time"
)

// ErrUnavailable means that no GPU information can be had on this host: no NVIDIA driver, no
// device, or a build without NVML (the default). It is never fatal; errors that wrap it say why.
var ErrUnavailable = errors.New("gpu: NVML unavailable")

// Device is one local GPU as NVML reports it. A field NVML could not read is zero.
type Device struct {
	Index             int     `json:"index"`
	UUID              string  `json:"uuid"`
	Name              string  `json:"name"`
	UtilizationGPU    float64 `json:"utilization_gpu"`    // 0–1, share of time a kernel ran over the last sample period
	UtilizationMemory float64 `json:"utilization_memory"` // 0–1, share of time memory was read or written
	MemoryUsed        uint64  `json:"memory_used_bytes"`
	MemoryTotal       uint64  `json:"memory_total_bytes"`
	TemperatureC      float64 `json:"temperature_c"`
	PowerW            float64 `json:"power_w"`
	PowerLimitW       float64 `json:"power_limit_w"`
}

// Source reports the local devices.
type Source interface {
	// Name names the source for logs and the admin page ("nvml", "fake").
	Name() string
	// Devices returns the devices now. An error wrapping ErrUnavailable means there are none
	// to be had on this host; callers log it once and carry on.
	Devices(ctx context.Context) ([]Device, error)
}

// Load is what a model server last reported about itself, and what the Scraper's checks
// made of it.
type Load struct {
	Waiting      float64 `json:"waiting"`        // requests queued, not yet running
	Running      float64 `json:"running"`        // requests in the running batch
	KVCacheUsage float64 `json:"kv_cache_usage"` // 0–1
	// Throughput is the server's work counter as read (Names.Throughput: generated tokens
	// with the presets); its rate is the server's throughput.
	Throughput float64 `json:"throughput_total,omitempty"`
	// Flags are the states the checks found as of this scrape (Scraper.Checks).
	Flags Flags     `json:"flags,omitempty"`
	At    time.Time `json:"at"` // when the scrape that produced it completed
}

// Loads is the hot-path read of endpoint loads. Get returns false when there is no fresh load
// for the endpoint (never scraped, failing, or older than the staleness limit): callers then
// fall back to their own signals (in-flight counts) rather than trust an old number.
// GetAt is Get at a given time, so that a picker scoring many endpoints reads the clock once.
// *Scraper and *Fake implement it.
type Loads interface {
	Get(endpoint string) (Load, bool)
	GetAt(endpoint string, now time.Time) (Load, bool)
}
