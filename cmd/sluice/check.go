package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
)

// usageError is a command line that is wrong (a missing or unknown flag): run exits 2 on it.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// runCheck is `sluice check`: like `nginx -t`, it loads config files as the gateway would
// and reports every problem of each, one per line with its file and line, or says ok.
func runCheck(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var files stringList
	fs.Var(&files, "config", "YAML config file to check (repeat for several; files may also follow the flags)")
	replicas := fs.Bool("for-replicas", false, "load as 'sluice xds' does: leave environment variables, files and the admin token to each replica")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice check [--for-replicas] --config FILE [--config FILE ...]
       sluice check [--for-replicas] FILE [FILE ...]

Loads each config file as 'sluice serve --config FILE' does (the same loader and checks, and
a build of every route's policies and of the tenants' keys) and starts nothing. Every problem
of a file is printed to stderr at once, one per line with its place in the file:

  sluice.yaml:3:16: drain_timeout: invalid duration "soon" (use e.g. "1s", "250ms")
  sluice.yaml:21: routes[1].cluster: unknown cluster "embeddings"

A good file prints one line to stdout: 'sluice.yaml: ok (3 routes, 4 clusters, 2 tenants)'.
With --for-replicas the file is loaded as 'sluice xds' serves it to its replicas: what only a
replica has (environment variables, files, the admin token) is left to each replica.
Exit status: 0 when every file is good, 1 when one has problems, 2 for a wrong command line.

Flags:
`)
		fs.PrintDefaults()
	}
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return usageError{err}
		}
		if fs.NArg() == 0 {
			break
		}
		if used := len(rest) - fs.NArg(); used > 0 && rest[used-1] == "--" {
			files = append(files, fs.Args()...)
			break
		}
		// Flags may follow the files too (sluice check a.yaml --for-replicas).
		files, rest = append(files, fs.Arg(0)), fs.Args()[1:]
	}
	if len(files) == 0 {
		fs.Usage()
		return usageError{errors.New("--config FILE is required")}
	}
	var bad, problems int
	for _, file := range files {
		if n := checkFile(file, *replicas, stdout, stderr); n > 0 {
			bad++
			problems += n
		}
	}
	switch {
	case bad == 0:
		return nil
	case len(files) == 1:
		return fmt.Errorf("%s: %s", files[0], plural(problems, "problem"))
	default:
		verb := "have"
		if bad == 1 {
			verb = "has"
		}
		return fmt.Errorf("%d of %d files %s problems (%s)", bad, len(files), verb, plural(problems, "problem"))
	}
}

// checkFile checks one file, prints its problems to stderr or its ok line to stdout, and
// returns how many problems it has.
func checkFile(file string, forReplicas bool, stdout, stderr io.Writer) int {
	load, ok := config.LoadFile, "ok"
	if forReplicas {
		load, ok = config.LoadFileForReplicas, "ok for replicas"
	}
	c, err := load(file)
	if err == nil {
		if err = proxy.CheckConfig(c); err != nil {
			var ve *config.ValidationError
			if errors.As(err, &ve) {
				data, _ := os.ReadFile(file) // for the lines; without them the problems still stand
				err = config.Locate(data, file, ve.Problems)
			}
		}
	}
	if err != nil {
		var ve *config.ValidationError
		if !errors.As(err, &ve) {
			fmt.Fprintf(stderr, "%s: %v\n", file, err)
			return 1
		}
		for _, line := range ve.Located() {
			fmt.Fprintln(stderr, line)
		}
		return max(1, len(ve.Problems))
	}
	fmt.Fprintf(stdout, "%s: %s (%s, %s, %s)\n", file, ok,
		plural(len(c.Routes), "route"), plural(len(c.Clusters), "cluster"), plural(len(c.Tenants), "tenant"))
	return 0
}

// plural is "1 route", "3 routes".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
