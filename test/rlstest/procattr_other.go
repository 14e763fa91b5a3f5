//go:build !linux

package rlstest

import "os/exec"

// dieWithTest does nothing here: only Linux has a parent-death signal. The tests' cleanups
// stop every child; a test process killed outright may leave them running.
func dieWithTest(*exec.Cmd) {}
