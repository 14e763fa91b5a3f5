package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
	xdsserver "github.com/sluicegw/sluice/xds/server"
)

// xdsServerFlags are the flags of `sluice xds`, set by parsing its flag set.
type xdsServerFlags struct {
	file, listen, routeConfig, logLevel, logFormat, shadowStore, admin *string
	watch                                                              *time.Duration
}

// newXDSFlags is the flag set of `sluice xds` (also parsed by the deploy tests, which check
// that the manifests' containers pass flags it has).
func newXDSFlags(stderr io.Writer) (*flag.FlagSet, *xdsServerFlags) {
	fs := flag.NewFlagSet("xds", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("config", "", "the Sluice YAML config to serve (required)")
	listen := fs.String("listen", "127.0.0.1:18000", "gRPC address of the xDS server")
	routeConfig := fs.String("route-config", xdsserver.DefaultRouteConfig, "name of the RouteConfiguration served (the replicas' bootstrap route_config)")
	watch := fs.Duration("watch", xdsserver.DefaultWatchInterval, "how often the config file is checked for changes")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text (key=value) or json (one object a line)")
	shadowStore := fs.String("shadow-store", "", "the shadow store the replicas share (postgres://…): step the weights of routes with a mirror.progression by the fleet's verdicts (default: the file's shadow.store when it is a postgres URL)")
	admin := fs.String("admin", "", "serve the control plane's status (GET /admin/xds: nodes, versions, progression, leader or follower) and Prometheus metrics (GET /metrics) on this address; none when empty")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice xds --config FILE [--listen 127.0.0.1:18000] [--route-config NAME] [--shadow-store URL] [--admin ADDR]

Serves a Sluice config file over xDS (ADS, delta and state-of-the-world; CDS, EDS, RDS and
ECDS) for a fleet of replicas started with 'sluice serve --xds ADDR'. When the file changes
and is valid, a new snapshot is pushed to every replica; an invalid file is logged with every
problem and the previous config keeps being served. With the fleet's shared shadow store it
runs the weight progression of routes with a mirror.progression: promote steps the
candidate's split up, rollback sets it to 0, pushed to every replica (docs/xds.md). Several
control planes may share the store: one leads the progression, the others serve the weights
it records there. Runs until SIGTERM or Ctrl-C.

Flags:
`)
		fs.PrintDefaults()
	}
	return fs, &xdsServerFlags{file: file, listen: listen, routeConfig: routeConfig, logLevel: logLevel, logFormat: logFormat,
		shadowStore: shadowStore, admin: admin, watch: watch}
}

// runXDS is `sluice xds`: a small control plane serving a config file over xDS.
func runXDS(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs, f := newXDSFlags(stderr)
	file, listen, routeConfig, watch, logLevel := f.file, f.listen, f.routeConfig, f.watch, f.logLevel
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *file == "" {
		return errors.New("--config is required")
	}
	if *watch <= 0 {
		*watch = time.Second
	}
	if st := *f.shadowStore; st != "" {
		if !shadow.IsPostgresURL(st) {
			return fmt.Errorf("--shadow-store %q: a postgres:// URL (the store the replicas share; a file is one gateway's own)", st)
		}
		if err := shadow.CheckPostgresURL(st); err != nil {
			return fmt.Errorf("--shadow-store: %w", err)
		}
	}
	log, err := newLogger(stderr, *logLevel, *f.logFormat)
	if err != nil {
		return err
	}
	srv, err := xdsserver.New(xdsserver.Options{ConfigPath: *file, RouteConfig: *routeConfig, WatchInterval: *watch, Logger: log,
		ShadowStore: *f.shadowStore})
	if err != nil {
		var ve *config.ValidationError
		if errors.As(err, &ve) {
			return err // lists every problem
		}
		return fmt.Errorf("config %s: %w", *file, err)
	}
	var adminLn net.Listener
	if *f.admin != "" {
		if adminLn, err = net.Listen("tcp", *f.admin); err != nil {
			return fmt.Errorf("admin listen %s: %w", *f.admin, err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		if adminLn != nil {
			_ = adminLn.Close()
		}
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	if adminLn == nil {
		return srv.Serve(ctx, ln)
	}
	hs := &http.Server{Handler: srv.AdminHandler(*f.admin), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	adminErr := make(chan error, 1)
	go func() { adminErr <- hs.Serve(adminLn) }()
	log.Info("xds control plane admin", "addr", adminLn.Addr().String())
	err = srv.Serve(ctx, ln)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if aerr := <-adminErr; !errors.Is(aerr, http.ErrServerClosed) && err == nil {
		err = fmt.Errorf("admin: %w", aerr)
	}
	return err
}
