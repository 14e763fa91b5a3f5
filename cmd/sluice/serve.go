package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/telemetry"
)

func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		file      = fs.String("config", "", "YAML config file (see examples/sluice.yaml); reloaded on SIGHUP and when it changes")
		upstreams stringList
		listen    = fs.String("listen", config.DefaultListen, "gateway listen address (with --upstream)")
		admin     = fs.String("admin", config.DefaultAdminListen, "admin listen address: /healthz, /readyz, /metrics, /admin/* (with --upstream)")
		logLevel  = fs.String("log-level", "info", "log level: debug, info, warn, error")
		chaos     = fs.Bool("chaos", false, "turn built-in fault injection on (faults from the config, PUT /admin/faults, or the x-sluice-fault header with the admin token)")
	)
	fs.Var(&upstreams, "upstream", "model server base URL, e.g. http://127.0.0.1:8000 (repeat for several endpoints of one cluster)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice serve --config FILE
       sluice serve --upstream URL [--upstream URL ...] [--listen ADDR] [--admin ADDR]

Runs the gateway. With --upstream, one route sends everything under /v1/ to one cluster made
of the given endpoints, with every default on; use --config for everything else.
Signals: SIGHUP reloads the config file; SIGTERM or SIGINT drains (in-flight streams finish up
to drain_timeout) and exits.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	var cfg *config.Config
	switch {
	case *file != "" && len(upstreams) > 0:
		return errors.New("use either --config or --upstream, not both")
	case *file != "":
		cfg, err = config.LoadFile(*file)
	case len(upstreams) > 0:
		cfg, err = config.FromUpstreams(*listen, *admin, upstreams)
	default:
		fs.Usage()
		return errors.New("--config or --upstream is required")
	}
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tel, err := telemetry.New(ctx, telemetry.Options{ServiceVersion: version, Registry: reg})
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()
	srv, err := proxy.New(proxy.Options{Config: cfg, ConfigPath: *file, Logger: log, Telemetry: tel, Version: version, Chaos: *chaos})
	if err != nil {
		return err
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if *file == "" {
					log.Warn("SIGHUP ignored: started with --upstream, there is no config file to reload")
					continue
				}
				_ = srv.Reload()
			}
		}
	}()
	return srv.Run(ctx)
}
