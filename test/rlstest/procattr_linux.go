package rlstest

import (
	"os/exec"
	"syscall"
)

// dieWithTest makes the kernel kill the child when the test process dies (a panic, a -timeout),
// so that no Redis or rate limit service outlives it.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
