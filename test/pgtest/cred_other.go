//go:build !unix

package pgtest

import "os/exec"

// runAs does nothing where there are no unix users (there is no root to leave either).
func runAs(*exec.Cmd, uint32, uint32) {}
