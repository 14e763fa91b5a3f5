// Command image builds Sluice's static container image, the `sluice` target of
// deploy/Dockerfile, as an OCI image layout and without a container engine:
//
//	go run ./deploy/image --out DIR [--version V] [--revision R] [--arch amd64|arm64]
//
// It cross-builds the binary with the Dockerfile's flags (CGO_ENABLED=0, GOOS=linux, -trimpath,
// -buildvcs=false, -ldflags "-s -w -X main.version=V"), assembles two layers in memory (the
// files of rootfs/ with the build host's CA bundle and /tmp, then the binary), gives the image
// the config that the Dockerfile's `sluice` stage declares, and writes DIR. Every timestamp is
// SOURCE_DATE_EPOCH, else the commit time of HEAD, so that the same inputs give the same
// digest. Push DIR with `crane push DIR REF` or `skopeo copy oci:DIR:TAG docker://REF`; see
// deploy/image.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command line: it returns the exit status, 2 for a wrong command line.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		out      = fs.String("out", "", "directory to write the OCI image layout to (created; an existing layout there is replaced)")
		version  = fs.String("version", "dev", "version: `sluice version` prints it, and the image's version label and tag")
		revision = fs.String("revision", "", "source revision for the org.opencontainers.image.revision label (default: git rev-parse HEAD, else unknown)")
		arch     = fs.String("arch", defaultArch(), "target architecture: amd64 or arm64")
		tag      = fs.String("tag", "", "the image's tag, its org.opencontainers.image.ref.name in the layout (default: the version)")
		repo     = fs.String("repo", defaultRepo, "repository the tag belongs to (the io.containerd.image.name annotation, used by docker load and ctr import)")
		caBundle = fs.String("ca-bundle", defaultCABundle, "PEM CA bundle to ship as /etc/ssl/certs/ca-certificates.crt (Debian's ca-certificates)")
		binary   = fs.String("binary", "", "ship this binary instead of building one; it must be built as this command builds it (checked: static, CGO_ENABLED=0, -trimpath, its version)")
		epoch    = fs.String("source-date-epoch", "", "Unix time of every timestamp in the image (default: $SOURCE_DATE_EPOCH, else the commit time of HEAD, else 0)")
	)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: go run ./deploy/image --out DIR [--version V] [--revision R] [--arch amd64|arm64]

Builds the static sluice image (deploy/Dockerfile's sluice target) without a container engine
and writes it to DIR as an OCI image layout: the binary cross-built with the Dockerfile's flags,
the configs of deploy/image/rootfs, the build host's CA bundle, user 65532, and the Dockerfile's
config (entrypoint, cmd, user, ports, labels). The same inputs give the same digest.

Push it:  crane push DIR REPO:TAG
     or:  skopeo copy oci:DIR:TAG docker://REPO:TAG

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "image: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	opts := options{
		Out: *out, Version: *version, Revision: *revision, Arch: *arch, Tag: *tag, Repo: *repo,
		CABundle: *caBundle, Binary: *binary, Log: stdout,
	}
	if opts.Out == "" {
		fmt.Fprintln(stderr, "image: --out DIR is required")
		return 2
	}
	if from := "--source-date-epoch"; *epoch != "" || os.Getenv("SOURCE_DATE_EPOCH") != "" {
		if *epoch == "" {
			*epoch, from = os.Getenv("SOURCE_DATE_EPOCH"), "SOURCE_DATE_EPOCH"
		}
		sec, err := strconv.ParseInt(*epoch, 10, 64)
		if err != nil || sec < 0 {
			fmt.Fprintf(stderr, "image: %s %q: want Unix seconds, 0 or more\n", from, *epoch)
			return 2
		}
		t := time.Unix(sec, 0).UTC()
		opts.Epoch, opts.EpochFrom = &t, from
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := build(ctx, opts); err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}
