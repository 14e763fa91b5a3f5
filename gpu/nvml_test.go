//go:build nvml && cgo && linux

package gpu

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// TestNVMLMappingDGXH100 maps go-nvml's simulated DGX H100 (eight H100 80GB), with the
// queries the server mock leaves unset filled in per device.
func TestNVMLMappingDGXH100(t *testing.T) {
	srv := dgxh100.New()
	for i, d := range srv.Devices {
		d := d.(*server.Device)
		d.MemoryInfo.Used = uint64(i+1) << 30
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 * i), Memory: 5}, nvml.SUCCESS
		}
		d.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
			if s != nvml.TEMPERATURE_GPU {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return uint32(40 + i), nvml.SUCCESS
		}
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 350_500, nvml.SUCCESS }
		d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 700_000, nvml.SUCCESS }
	}
	n, err := newNVMLFrom(srv)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := n.Devices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 8 {
		t.Fatalf("%d devices, want 8", len(devs))
	}
	uuids := map[string]bool{}
	for i, d := range devs {
		want := Device{Index: i, UUID: d.UUID, Name: "NVIDIA H100 80GB HBM3",
			UtilizationGPU: float64(10*i) / 100, UtilizationMemory: 0.05,
			MemoryUsed: uint64(i+1) << 30, MemoryTotal: 81920 << 20,
			TemperatureC: float64(40 + i), PowerW: 350.5, PowerLimitW: 700}
		if d != want {
			t.Errorf("device %d = %+v\nwant %+v", i, d, want)
		}
		if d.UUID == "" || uuids[d.UUID] {
			t.Errorf("device %d: UUID %q missing or repeated", i, d.UUID)
		}
		uuids[d.UUID] = true
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

// mockDevice returns a mock device whose every query succeeds.
func mockDevice() *mock.Device {
	return &mock.Device{
		GetNameFunc: func() (string, nvml.Return) { return "NVIDIA L4", nvml.SUCCESS },
		GetUUIDFunc: func() (string, nvml.Return) { return "GPU-1234", nvml.SUCCESS },
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: 75, Memory: 30}, nvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 24 << 30, Used: 6 << 30, Free: 18 << 30}, nvml.SUCCESS
		},
		GetTemperatureFunc:          func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 61, nvml.SUCCESS },
		GetPowerUsageFunc:           func() (uint32, nvml.Return) { return 52_250, nvml.SUCCESS },
		GetEnforcedPowerLimitFunc:   func() (uint32, nvml.Return) { return 72_000, nvml.SUCCESS },
		GetPowerManagementLimitFunc: func() (uint32, nvml.Return) { return 75_000, nvml.SUCCESS },
	}
}

var fullL4 = Device{Index: 0, UUID: "GPU-1234", Name: "NVIDIA L4", UtilizationGPU: 0.75, UtilizationMemory: 0.3,
	MemoryUsed: 6 << 30, MemoryTotal: 24 << 30, TemperatureC: 61, PowerW: 52.25, PowerLimitW: 72}

// TestNVMLFieldFailures: a failing query leaves its field zero and the rest intact.
func TestNVMLFieldFailures(t *testing.T) {
	notSupported := nvml.ERROR_NOT_SUPPORTED
	tests := []struct {
		name    string
		breakIt func(d *mock.Device)
		want    func(d *Device)
	}{
		{"all good", func(*mock.Device) {}, func(*Device) {}},
		{"name", func(d *mock.Device) { d.GetNameFunc = func() (string, nvml.Return) { return "x", notSupported } },
			func(d *Device) { d.Name = "" }},
		{"uuid", func(d *mock.Device) { d.GetUUIDFunc = func() (string, nvml.Return) { return "x", notSupported } },
			func(d *Device) { d.UUID = "" }},
		{"utilization", func(d *mock.Device) {
			d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 9}, notSupported }
		}, func(d *Device) { d.UtilizationGPU, d.UtilizationMemory = 0, 0 }},
		{"memory", func(d *mock.Device) {
			d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 9}, nvml.ERROR_GPU_IS_LOST }
		}, func(d *Device) { d.MemoryUsed, d.MemoryTotal = 0, 0 }},
		{"temperature", func(d *mock.Device) {
			d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 9, notSupported }
		}, func(d *Device) { d.TemperatureC = 0 }},
		{"power", func(d *mock.Device) { d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 9, notSupported } },
			func(d *Device) { d.PowerW = 0 }},
		{"enforced limit falls back to management limit", func(d *mock.Device) {
			d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 9, notSupported }
		}, func(d *Device) { d.PowerLimitW = 75 }},
		{"no power limit", func(d *mock.Device) {
			d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 9, notSupported }
			d.GetPowerManagementLimitFunc = func() (uint32, nvml.Return) { return 9, notSupported }
		}, func(d *Device) { d.PowerLimitW = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			md := mockDevice()
			tc.breakIt(md)
			lib := &mock.Interface{
				InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
				DeviceGetCountFunc:         func() (int, nvml.Return) { return 1, nvml.SUCCESS },
				DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return md, nvml.SUCCESS },
			}
			n, err := newNVMLFrom(lib)
			if err != nil {
				t.Fatal(err)
			}
			devs, err := n.Devices(t.Context())
			if err != nil || len(devs) != 1 {
				t.Fatalf("Devices = %+v, %v", devs, err)
			}
			want := fullL4
			tc.want(&want)
			if devs[0] != want {
				t.Errorf("got  %+v\nwant %+v", devs[0], want)
			}
		})
	}
}

func TestNVMLHandleAndCountFailures(t *testing.T) {
	md := mockDevice()
	lib := &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return 3, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i == 1 {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return md, nvml.SUCCESS
		},
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	n, err := newNVMLFrom(lib)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := n.Devices(t.Context())
	if err != nil || len(devs) != 3 {
		t.Fatalf("Devices = %+v, %v", devs, err)
	}
	if devs[1] != (Device{Index: 1}) || devs[2].Index != 2 || devs[2].Name != "NVIDIA L4" {
		t.Errorf("devices %+v", devs)
	}

	lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	if _, err := n.Devices(t.Context()); err == nil || errors.Is(err, ErrUnavailable) {
		t.Errorf("failing count: err = %v, want a plain error", err)
	}

	// Close shuts down once; afterwards nothing is called.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	calls := len(lib.DeviceGetCountCalls())
	if _, err := n.Devices(t.Context()); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Devices after Close: err = %v", err)
	}
	if len(lib.ShutdownCalls()) != 1 || len(lib.DeviceGetCountCalls()) != calls {
		t.Errorf("Shutdown calls %d, count calls after Close %d", len(lib.ShutdownCalls()), len(lib.DeviceGetCountCalls())-calls)
	}
	ctx, cancel := contextCanceled(t)
	defer cancel()
	n2, _ := newNVMLFrom(lib)
	lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 2, nvml.SUCCESS }
	if _, err := n2.Devices(ctx); err == nil {
		t.Error("cancelled context: no error")
	}
}

// TestNVMLNoDriver: after a failed Init nothing else is ever called (the mock panics on any
// method whose Func is unset, and the call records show only Init).
func TestNVMLNoDriver(t *testing.T) {
	for _, ret := range []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_NO_PERMISSION} {
		t.Run(ret.Error(), func(t *testing.T) {
			lib := &mock.Interface{InitFunc: func() nvml.Return { return ret }}
			n, err := newNVMLFrom(lib)
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), ret.Error()) {
				t.Fatalf("err = %v, want ErrUnavailable with %q", err, ret.Error())
			}
			if n == nil || n.Name() != "nvml" {
				t.Fatal("no usable *NVML returned")
			}
			for range 3 {
				if devs, err := n.Devices(t.Context()); !errors.Is(err, ErrUnavailable) || devs != nil {
					t.Errorf("Devices = %v, %v", devs, err)
				}
			}
			if err := n.Close(); err != nil {
				t.Errorf("Close = %v", err)
			}
			if len(lib.InitCalls()) != 1 || len(lib.DeviceGetCountCalls()) != 0 || len(lib.ShutdownCalls()) != 0 ||
				len(lib.ErrorStringCalls()) != 0 {
				t.Errorf("calls: init %d, count %d, shutdown %d, errorstring %d", len(lib.InitCalls()),
					len(lib.DeviceGetCountCalls()), len(lib.ShutdownCalls()), len(lib.ErrorStringCalls()))
			}
		})
	}
}

// TestNewNVMLReal runs the real library: on a host without a driver (as here) Init fails
// cleanly and the process survives every later call; on a GPU host it lists the devices.
func TestNewNVMLReal(t *testing.T) {
	n, err := NewNVML() // n is usable even when err is not nil
	if n == nil {
		t.Fatalf("NewNVML returned nil (err %v)", err)
	}
	defer n.Close()
	devs, derr := n.Devices(t.Context())
	if err != nil {
		if !errors.Is(err, ErrUnavailable) || !errors.Is(derr, ErrUnavailable) {
			t.Fatalf("NewNVML = %v, Devices = %v; want ErrUnavailable", err, derr)
		}
		t.Logf("no NVML here (expected without a GPU): %v", err)
		return
	}
	if derr != nil {
		t.Fatalf("Devices: %v", derr)
	}
	for _, d := range devs {
		t.Logf("%+v", d)
	}
}

func contextCanceled(t testing.TB) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	return ctx, cancel
}
