package proxy

import (
	"context"
	"runtime"
	"runtime/debug"
	"time"
)

// After a burst (thousands of streams held, then gone) the Go runtime keeps the freed heap and
// goroutine stacks mapped and returns them to the OS only gradually, so the gateway's RSS
// stays near its peak for minutes. The memory loop returns them at once when most of what the
// process holds is free: it reads the heap every memoryCheckEvery and, when the free memory not
// yet returned is both large (≥ memoryReleaseMin) and more than the heap in use, calls
// debug.FreeOSMemory (a full collection, then everything free goes back) at most once per
// memoryReleaseGap. Under a steady load the free share stays small and nothing happens.

const (
	memoryCheckEvery = 5 * time.Second
	memoryReleaseMin = 64 << 20
	memoryReleaseGap = 30 * time.Second
)

// memSample is what the memory loop decides on.
type memSample struct {
	inUse    uint64 // heap and stacks in use
	retained uint64 // free heap and stack memory not yet returned to the OS
}

// readMem samples the runtime's memory.
func readMem() memSample {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memSample{inUse: m.HeapInuse + m.StackInuse, retained: m.HeapIdle - m.HeapReleased}
}

// shouldRelease reports whether the free memory m retains is worth returning now, last being
// the previous release.
func shouldRelease(m memSample, now, last time.Time) bool {
	return m.retained >= memoryReleaseMin && m.retained > m.inUse && now.Sub(last) >= memoryReleaseGap
}

// memoryLoop returns retained free memory to the OS after bursts until ctx ends.
func (s *Server) memoryLoop(ctx context.Context) {
	t := time.NewTicker(memoryCheckEvery)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m := readMem()
			if !shouldRelease(m, now, last) {
				continue
			}
			last = now
			debug.FreeOSMemory()
			after := readMem()
			s.log.Debug("freed memory returned to the OS after a burst",
				"retained_mib", m.retained>>20, "in_use_mib", m.inUse>>20, "retained_after_mib", after.retained>>20)
		}
	}
}
