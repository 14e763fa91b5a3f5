// Package fleet tests several Sluice replicas together against the real distributed parts
// they share: Redis and Envoy's rate limit service, started by test/rlstest. The replicas
// here are proxy.Server values in the test process; test/e2e's TestFleet runs the same
// checks on `sluice serve --bootstrap` processes following `sluice xds`.
//
// Every listener binds 127.0.0.1 on an ephemeral port, every process runs in a temporary
// directory and is stopped when its test ends, every wait is bounded, and the package leaks
// no goroutines (goleak). A test that needs redis-server skips when it is missing, unless
// SLUICE_REQUIRE_TOOLS=1 (CI), which makes that a failure. Run with:
//
//	go test -race ./test/fleet/
package fleet

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
