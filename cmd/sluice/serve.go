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
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/telemetry"
	"github.com/sluicegw/sluice/xds"
)

// serveFlags are the flags of `sluice serve`, set by parsing its flag set.
type serveFlags struct {
	file, listen, admin, hcPath, logLevel, logFormat, xdsAddr, bootFile, nodeID, xdsPers *string
	chaos, xdsSotW                                                                       *bool
	upstreams                                                                            *stringList
}

// newServeFlags is the flag set of `sluice serve` (also parsed by the deploy tests, which check
// that the manifests' containers pass flags it has).
func newServeFlags(stderr io.Writer) (*flag.FlagSet, *serveFlags) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		file      = fs.String("config", "", "YAML config file (see examples/sluice.yaml); reloaded on SIGHUP and when it changes")
		upstreams stringList
		listen    = fs.String("listen", config.DefaultListen, "gateway listen address (with --upstream)")
		admin     = fs.String("admin", config.DefaultAdminListen, "admin listen address: /healthz, /readyz, /metrics, /admin/* (with --upstream)")
		hcPath    = fs.String("health-path", "", "health-check path of the --upstream endpoints (default: /health, and /v1/models for servers without it)")
		logLevel  = fs.String("log-level", "info", "log level: debug, info, warn, error")
		logFormat = fs.String("log-format", "text", "log format: text (key=value) or json (one object a line)")
		chaos     = fs.Bool("chaos", false, "turn built-in fault injection on (faults from the config, PUT /admin/faults, or the x-sluice-fault header with the admin token)")
		xdsAddr   = fs.String("xds", "", "follow an xDS control plane at host:port (ADS, delta xDS): clusters, endpoints, routes and policy come from it")
		bootFile  = fs.String("bootstrap", "", "xDS bootstrap file (YAML or JSON: node_id, cluster, server, tls, route_config, sotw, persist, listen, admin); flags given as well override it")
		nodeID    = fs.String("node-id", "", "xDS node id (default: the hostname)")
		xdsSotW   = fs.Bool("xds-sotw", false, "use state-of-the-world xDS (StreamAggregatedResources) instead of delta xDS")
		xdsPers   = fs.String("xds-persist", "", "file keeping the last good xDS config; served from when the control plane is unreachable at start")
	)
	f := &serveFlags{file: file, upstreams: &upstreams, listen: listen, admin: admin, hcPath: hcPath, logLevel: logLevel, logFormat: logFormat, chaos: chaos,
		xdsAddr: xdsAddr, bootFile: bootFile, nodeID: nodeID, xdsSotW: xdsSotW, xdsPers: xdsPers}
	fs.Var(&upstreams, "upstream", "model server base URL, e.g. http://127.0.0.1:8000 (repeat for several endpoints of one cluster)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice serve --config FILE
       sluice serve --upstream URL [--upstream URL ...] [--listen ADDR] [--admin ADDR] [--health-path PATH]
       sluice serve --xds HOST:PORT [--node-id ID] [--xds-sotw] [--xds-persist FILE] [--listen ADDR] [--admin ADDR]
       sluice serve --bootstrap FILE

Runs the gateway. With --upstream, one route sends everything under /v1/ to one cluster made
of the given endpoints, with every default on; use --config for everything else. With --xds
(or --bootstrap), a control plane sends the config over xDS; /readyz is false until the first
good config arrives (see docs/xds-client.md).
Signals: SIGHUP reloads the config file; SIGTERM or SIGINT drains (in-flight streams finish up
to drain_timeout) and exits.

Flags:
`)
		fs.PrintDefaults()
	}
	return fs, f
}

func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs, f := newServeFlags(stderr)
	file, listen, admin, hcPath, logLevel, chaos := f.file, f.listen, f.admin, f.hcPath, f.logLevel, f.chaos
	xdsAddr, bootFile, nodeID, xdsSotW, xdsPers := f.xdsAddr, f.bootFile, f.nodeID, f.xdsSotW, f.xdsPers
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	upstreams := *f.upstreams
	log, err := newLogger(stderr, *logLevel, *f.logFormat)
	if err != nil {
		return err
	}
	useXDS := *xdsAddr != "" || *bootFile != ""
	var cfg *config.Config
	switch {
	case *file != "" && len(upstreams) > 0:
		return errors.New("use either --config or --upstream, not both")
	case useXDS && (*file != "" || len(upstreams) > 0):
		return errors.New("use either --xds/--bootstrap or --config/--upstream, not both")
	case useXDS:
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		boot, err := xdsBootstrap(*bootFile, set, xdsFlags{
			server: *xdsAddr, nodeID: *nodeID, sotw: *xdsSotW, persist: *xdsPers, listen: *listen, admin: *admin,
		})
		if err != nil {
			return err
		}
		return serveXDS(ctx, boot, log, *chaos)
	case *file != "":
		cfg, err = config.LoadFile(*file)
	case len(upstreams) > 0:
		cfg, err = config.FromUpstreams(*listen, *admin, upstreams, *hcPath)
	default:
		fs.Usage()
		return errors.New("--config or --upstream is required (or --xds/--bootstrap to follow a control plane)")
	}
	if err != nil {
		return err
	}
	tel, err := newTelemetry(ctx)
	if err != nil {
		return err
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

// xdsFlags are the xDS flags of `sluice serve`.
type xdsFlags struct {
	server, nodeID, persist, listen, admin string
	sotw                                   bool
}

// xdsBootstrap builds the bootstrap from the file (if any) and the flags given, which win.
func xdsBootstrap(file string, set map[string]bool, f xdsFlags) (xds.Bootstrap, error) {
	var b xds.Bootstrap
	if file != "" {
		var err error
		if b, err = xds.LoadBootstrap(file); err != nil {
			return b, err
		}
	} else {
		b.Delta = true
	}
	if f.server != "" {
		b.Server = f.server
	}
	if set["node-id"] {
		b.NodeID = f.nodeID
	}
	if set["xds-sotw"] {
		b.Delta = !f.sotw
	}
	if set["xds-persist"] {
		b.PersistPath = f.persist
	}
	if set["listen"] || b.Listen == "" {
		b.Listen = f.listen
	}
	if set["admin"] || b.Admin == "" {
		b.Admin = f.admin
	}
	b.ApplyDefaults()
	if err := b.Validate(); err != nil {
		return b, err
	}
	return b, nil
}

// serveXDS runs the gateway on the config an xDS control plane sends: it starts on an empty
// config (not ready), and the ADS client applies every good config the control plane pushes.
func serveXDS(ctx context.Context, boot xds.Bootstrap, log *slog.Logger, chaos bool) error {
	topts := xds.TranslateOptions{Listen: boot.Listen, TLS: boot.ListenTLS, AdminListen: boot.Admin, AdminMetricsTokenEnv: boot.MetricsTokenEnv, RouteConfig: boot.RouteConfig,
		LoadSignals: boot.LoadSignals, Chaos: chaos, ShadowStore: boot.ShadowStore, ShadowInstance: boot.NodeID}
	cfg, err := xds.InitialConfig(topts)
	if err != nil {
		return err
	}
	tel, err := newTelemetry(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()
	var client *xds.Client
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: log, Telemetry: tel, Version: version, Chaos: chaos, AwaitConfig: true,
		XDSStatus: func() any { return client.Status() }})
	if err != nil {
		return err
	}
	client, err = xds.NewClient(xds.ClientOptions{
		Bootstrap: boot,
		Translate: func(r xds.Resources) (*config.Config, error) { return xds.Translate(r, topts) },
		Apply:     srv.Apply,
		Check:     srv.Check,
		Logger:    log,
		Version:   version,
	})
	if err != nil {
		return err
	}
	mreg, err := client.RegisterMetrics(tel.Meter())
	if err != nil {
		return fmt.Errorf("xds metrics: %w", err)
	}
	defer func() { _ = mreg.Unregister() }()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-cctx.Done():
				return
			case <-hup:
				log.Warn("SIGHUP ignored: the config comes from the xDS control plane", "server", boot.Server)
			}
		}
	}()
	go func() {
		defer wg.Done()
		_ = client.Run(cctx)
	}()
	err = srv.Run(ctx)
	cancel()
	wg.Wait()
	return err
}

// newTelemetry is the gateway's telemetry with the Go runtime and process collectors on its
// Prometheus registry.
func newTelemetry(ctx context.Context) (*telemetry.Telemetry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tel, err := telemetry.New(ctx, telemetry.Options{ServiceVersion: version, Registry: reg})
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	return tel, nil
}
