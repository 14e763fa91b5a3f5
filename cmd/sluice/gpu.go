package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicegw/sluice/gpu"
)

// gpuReport is what `sluice gpu --json` prints.
type gpuReport struct {
	NVML struct {
		Available bool         `json:"available"`
		Error     string       `json:"error,omitempty"`
		Devices   []gpu.Device `json:"devices"`
	} `json:"nvml"`
	Endpoints []gpuEndpoint `json:"endpoints,omitempty"`
}

type gpuEndpoint struct {
	MetricsURL string    `json:"metrics_url"`
	Load       *gpu.Load `json:"load,omitempty"`
	Error      string    `json:"error,omitempty"`
}

func runGPU(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gpu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON instead of tables")
	var metrics stringList
	fs.Var(&metrics, "metrics", "a model server's metrics URL to scrape once (repeatable)")
	names := fs.String("names", "vllm", "metric names of the model servers: vllm, tgi, triton or sglang")
	timeout := fs.Duration("timeout", 5*time.Second, "time limit for each scrape")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice gpu [--json] [--metrics URL]... [--names vllm|tgi|triton|sglang]

Prints what this host's NVIDIA driver (NVML) reports for each GPU: utilization, memory,
temperature and power. Without a GPU or driver it says so and exits 0. With --metrics it also
scrapes each model server's Prometheus page once and prints its load (queued and running
requests, KV-cache use); it exits 1 if a scrape fails.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	preset, ok := gpu.Preset(*names)
	if !ok {
		return fmt.Errorf("--names %q: want vllm, tgi, triton or sglang", *names)
	}

	var rep gpuReport
	n, err := gpu.NewNVML() // n is usable (it reports err) even when err is not nil
	if n != nil {
		defer n.Close()
	}
	if err == nil {
		rep.NVML.Available = true
		rep.NVML.Devices, err = n.Devices(ctx)
	}
	if err != nil {
		rep.NVML.Error = err.Error()
	}
	nvmlErr := err
	if nvmlErr != nil && errors.Is(nvmlErr, gpu.ErrUnavailable) {
		nvmlErr = nil // no GPU is an answer, not a failure
	}

	failed := 0
	if len(metrics) > 0 {
		s := &gpu.Scraper{Names: preset, Timeout: *timeout}
		loads, errs := s.ScrapeOnce(ctx, metrics)
		for i, u := range metrics {
			ep := gpuEndpoint{MetricsURL: u}
			if errs[i] != nil {
				ep.Error = errs[i].Error()
				failed++
			} else {
				ep.Load = &loads[i]
			}
			rep.Endpoints = append(rep.Endpoints, ep)
		}
	}

	if *asJSON {
		if rep.NVML.Devices == nil {
			rep.NVML.Devices = []gpu.Device{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printGPUReport(stdout, &rep)
	}
	switch {
	case nvmlErr != nil:
		return fmt.Errorf("nvml: %w", nvmlErr)
	case failed > 0:
		return fmt.Errorf("%d of %d metrics scrapes failed", failed, len(metrics))
	}
	return nil
}

func printGPUReport(w io.Writer, rep *gpuReport) {
	switch {
	case !rep.NVML.Available:
		fmt.Fprintf(w, "NVML unavailable: %s\n", strings.TrimPrefix(rep.NVML.Error, gpu.ErrUnavailable.Error()+": "))
	case rep.NVML.Error != "":
		fmt.Fprintf(w, "nvml: %s\n", rep.NVML.Error)
	case len(rep.NVML.Devices) == 0:
		fmt.Fprintln(w, "nvml: driver loaded, no devices")
	default:
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "GPU\tNAME\tUUID\tUTIL\tMEM UTIL\tMEMORY USED / TOTAL\tTEMP\tPOWER / LIMIT")
		for _, d := range rep.NVML.Devices {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%.0f%%\t%.0f%%\t%.1f / %.1f GiB\t%.0f C\t%.0f / %.0f W\n",
				d.Index, d.Name, d.UUID, 100*d.UtilizationGPU, 100*d.UtilizationMemory,
				float64(d.MemoryUsed)/(1<<30), float64(d.MemoryTotal)/(1<<30), d.TemperatureC, d.PowerW, d.PowerLimitW)
		}
		_ = tw.Flush()
	}
	if len(rep.Endpoints) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "METRICS URL\tWAITING\tRUNNING\tKV CACHE\tERROR")
	for _, e := range rep.Endpoints {
		if e.Load == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t%s\n", e.MetricsURL, e.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%g\t%g\t%.1f%%\t\n", e.MetricsURL, e.Load.Waiting, e.Load.Running, 100*e.Load.KVCacheUsage)
	}
	_ = tw.Flush()
}
