// Package e2e holds Sluice's black-box end-to-end tests: the official openai-go client talks
// to the gateway (in process, or the sluice binary as a subprocess), which talks to the
// simulated model server (test/sim) or to small recording upstreams.
//
// Every listener binds 127.0.0.1 on an ephemeral port; every wait is bounded; the package
// leaks no goroutines (goleak). Run with:
//
//	go test -race ./test/e2e/
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// sluiceBin is the sluice binary built once by TestMain for the subprocess tests ("" when
// the build failed; those tests then fail with buildErr).
var (
	sluiceBin string
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	sluiceBin, buildErr = buildSluice(dir)
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { _ = os.RemoveAll(dir) }))
}

// buildSluice builds ./cmd/sluice into dir with the go command of the toolchain running the
// tests (go test puts its GOROOT/bin first on PATH).
func buildSluice(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("go command not found: %w", err)
	}
	if out, err := exec.Command(goBin, "env", "GOROOT").Output(); err == nil {
		if p := filepath.Join(string(trimNL(out)), "bin", "go"); fileExists(p) {
			goBin = p
		}
	}
	bin := filepath.Join(dir, "sluice")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/sluicegw/sluice/cmd/sluice")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/sluice: %v\n%s", err, out)
	}
	return bin, nil
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
