//go:build !unix

package procs

import "time"

// processCPU cannot read the process's CPU time here: no Controller runs.
func processCPU() (time.Duration, bool) { return 0, false }
