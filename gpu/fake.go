package gpu

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluicegw/sluice/policy/clock"
)

// Fake is a Source and a Loads for tests: loads and devices are set by hand.
// The zero value has no loads and no devices. Safe for concurrent use.
type Fake struct {
	// Staleness, when positive, makes Get report false for loads whose At is older than this
	// (by Clock, default the system clock). Zero: loads never go stale.
	Staleness time.Duration
	Clock     clock.Clock

	mu      sync.RWMutex
	loads   map[string]Load
	devices []Device
	err     error
}

var (
	_ Source = (*Fake)(nil)
	_ Loads  = (*Fake)(nil)
)

// Name returns "fake".
func (f *Fake) Name() string { return "fake" }

// SetLoad sets endpoint's load; a zero At is set to now.
func (f *Fake) SetLoad(endpoint string, l Load) {
	if l.At.IsZero() {
		l.At = f.now()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loads == nil {
		f.loads = map[string]Load{}
	}
	f.loads[endpoint] = l
}

// RemoveLoad forgets endpoint's load.
func (f *Fake) RemoveLoad(endpoint string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.loads, endpoint)
}

// Get returns endpoint's load, if set and not stale.
func (f *Fake) Get(endpoint string) (Load, bool) { return f.GetAt(endpoint, f.now()) }

// GetAt is Get at time now.
func (f *Fake) GetAt(endpoint string, now time.Time) (Load, bool) {
	f.mu.RLock()
	l, ok := f.loads[endpoint]
	f.mu.RUnlock()
	if !ok || f.Staleness > 0 && now.Sub(l.At) > f.Staleness {
		return Load{}, false
	}
	return l, true
}

// SetDevices sets what Devices returns: a copy of devs, or err when err is not nil.
func (f *Fake) SetDevices(devs []Device, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.devices, f.err = slices.Clone(devs), err
}

// Devices returns what SetDevices set (a copy).
func (f *Fake) Devices(context.Context) ([]Device, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.err != nil {
		return nil, f.err
	}
	return slices.Clone(f.devices), nil
}

func (f *Fake) now() time.Time {
	if f.Clock != nil {
		return f.Clock.Now()
	}
	return time.Now()
}
