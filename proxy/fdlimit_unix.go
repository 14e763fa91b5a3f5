//go:build unix

package proxy

import "syscall"

// openFileLimit is the process's open-file limit (the soft limit, which Go raises to the hard
// one at start), 0 when unknown.
func openFileLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur)
}
