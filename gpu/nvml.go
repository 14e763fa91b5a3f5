//go:build nvml && cgo && linux

package gpu

import (
	"context"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is the Source backed by NVIDIA's management library (libnvidia-ml.so, loaded at run
// time by go-nvml). Init is called once, by NewNVML. When it fails, no other NVML function is
// ever called: the library is absent or unusable and calling into it would kill the process.
type NVML struct {
	mu  sync.RWMutex
	lib nvml.Interface
	ok  bool  // Init succeeded and Close has not run: the only state in which lib is called
	err error // why not ok; wraps ErrUnavailable
}

var _ Source = (*NVML)(nil)

// NewNVML initialises NVML. Without a driver it returns an error wrapping ErrUnavailable
// (with NVML's reason) together with a usable *NVML whose Devices returns that error, so
// callers can keep it as their Source either way.
func NewNVML() (*NVML, error) {
	return newNVMLFrom(nvml.New())
}

// newNVMLFrom initialises lib; tests pass go-nvml's mocks.
func newNVMLFrom(lib nvml.Interface) (*NVML, error) {
	n := &NVML{lib: lib}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		// Return.Error is Go code while the library is not loaded (and nvmlErrorString,
		// valid at any time, when it is): it never calls into a missing library.
		n.err = fmt.Errorf("%w: nvml init: %s", ErrUnavailable, ret.Error())
		return n, n.err
	}
	n.ok = true
	return n, nil
}

// Name returns "nvml".
func (n *NVML) Name() string { return "nvml" }

// Devices queries every device. A field whose query fails is left zero; only a failing
// device count is an error.
func (n *NVML) Devices(ctx context.Context) ([]Device, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if !n.ok {
		return nil, n.err
	}
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu: nvml device count: %s", ret.Error())
	}
	devs := make([]Device, 0, count)
	for i := range count {
		if err := ctx.Err(); err != nil {
			return devs, err
		}
		devs = append(devs, readDevice(n.lib, i))
	}
	return devs, nil
}

// readDevice reads one device; each query is checked on its own.
func readDevice(lib nvml.Interface, i int) Device {
	d := Device{Index: i}
	h, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS || h == nil {
		return d
	}
	if s, ret := h.GetName(); ret == nvml.SUCCESS {
		d.Name = s
	}
	if s, ret := h.GetUUID(); ret == nvml.SUCCESS {
		d.UUID = s
	}
	if u, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
		d.UtilizationGPU = float64(u.Gpu) / 100
		d.UtilizationMemory = float64(u.Memory) / 100
	}
	if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		d.MemoryUsed, d.MemoryTotal = m.Used, m.Total
	}
	if t, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		d.TemperatureC = float64(t)
	}
	if mw, ret := h.GetPowerUsage(); ret == nvml.SUCCESS {
		d.PowerW = float64(mw) / 1000
	}
	if mw, ret := h.GetEnforcedPowerLimit(); ret == nvml.SUCCESS {
		d.PowerLimitW = float64(mw) / 1000
	} else if mw, ret := h.GetPowerManagementLimit(); ret == nvml.SUCCESS {
		d.PowerLimitW = float64(mw) / 1000
	}
	return d
}

// Close shuts NVML down if Init succeeded; later Devices calls report ErrUnavailable.
// It is safe to call more than once.
func (n *NVML) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.ok {
		return nil
	}
	n.ok = false
	n.err = fmt.Errorf("%w: nvml closed", ErrUnavailable)
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: nvml shutdown: %s", ret.Error())
	}
	return nil
}
