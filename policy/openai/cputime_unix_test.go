//go:build unix

package openai

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time the process has used (user and system): benchmarks report their
// cost in it as well as in wall time, which other work on a shared machine inflates.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
