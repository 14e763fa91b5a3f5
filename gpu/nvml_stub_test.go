//go:build !(nvml && cgo && linux)

package gpu

import (
	"errors"
	"testing"
)

func TestNVMLStub(t *testing.T) {
	n, err := NewNVML()
	if !errors.Is(err, ErrUnavailable) || n == nil {
		t.Fatalf("NewNVML = %v, %v", n, err)
	}
	if _, err := n.Devices(t.Context()); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Devices err = %v", err)
	}
	if n.Name() != "nvml" || n.Close() != nil {
		t.Error("Name or Close")
	}
}
