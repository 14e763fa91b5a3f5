// Command sluice is the inference gateway. Subcommands:
//
//	sluice serve    run the gateway (--config FILE, or --upstream URL for a first try)
//	sluice mock     run the simulated OpenAI-compatible model server
//	sluice demo     an end-to-end run on embedded defaults
//	sluice load     the token-level load injector
//	sluice gpu      print what this host's NVML reports
//	sluice xds      serve a config file over xDS to replicas (`sluice serve --xds`)
//	sluice check    load and validate config files, print every problem (like `nginx -t`)
//	sluice version  print the version
//
// This file holds flags and wiring only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the gateway", runServe},
		{"mock", "run the simulated OpenAI-compatible model server", runMock},
		{"demo", "end-to-end run: two simulators, the gateway and a streaming workload", runDemo},
		{"load", "token-level load injector: workloads, pacing, token metrics, reports", runLoad},
		{"shadow", "shadow traffic: the candidate's verdict report, and pairs exported for replay", runShadow},
		{"gpu", "print what this host's NVML reports (and model-server load with --metrics)", runGPU},
		{"xds", "serve a config file over xDS to a fleet of replicas (a small control plane)", runXDS},
		{"check", "load and validate config files as serve would; print every problem with its line", runCheck},
		{"version", "print the version", func(_ context.Context, args []string, stdout, _ io.Writer) error {
			fs := flag.NewFlagSet("version", flag.ContinueOnError)
			fs.Usage = func() { fmt.Fprintln(fs.Output(), "usage: sluice version\n\nPrints the version of this binary.") }
			if err := fs.Parse(args); err != nil {
				return err
			}
			fmt.Fprintln(stdout, "sluice", version)
			return nil
		}},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Sluice: an inference gateway for OpenAI-compatible model servers.")
	fmt.Fprintln(w, "\nusage: sluice <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'sluice <command> --help' for a command's flags.")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, new(usageError)):
			fmt.Fprintf(stderr, "sluice %s: %v\n", c.name, err)
			return 2
		default:
			fmt.Fprintf(stderr, "sluice %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "sluice: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// newLogger is the logger of a long-running command: level one of debug, info, warn, error;
// format text (logfmt-like key=value lines) or json (one object a line, for log pipelines).
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	o := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not text or json", format)
}
