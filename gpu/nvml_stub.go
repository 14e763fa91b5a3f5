//go:build !(nvml && cgo && linux)

package gpu

import (
	"context"
	"fmt"
)

// NVML is the NVML Source. This build has no NVML (the default build: pure Go, static; the
// "nvml" build tag with cgo on Linux has it, see deploy/README.md), so it is always
// unavailable.
type NVML struct{ err error }

var _ Source = (*NVML)(nil)

// NewNVML returns an error wrapping ErrUnavailable, together with a usable *NVML whose
// Devices returns that error.
func NewNVML() (*NVML, error) {
	n := &NVML{err: fmt.Errorf("%w: this build has no NVML (the static sluice build; use the sluice-gpu image, or build with -tags nvml and cgo on linux)", ErrUnavailable)}
	return n, n.err
}

// Name returns "nvml".
func (n *NVML) Name() string { return "nvml" }

// Devices returns ErrUnavailable.
func (n *NVML) Devices(context.Context) ([]Device, error) { return nil, n.err }

// Close does nothing.
func (n *NVML) Close() error { return nil }
