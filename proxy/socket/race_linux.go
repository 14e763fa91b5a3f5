//go:build linux && race

package socket

import (
	"errors"
	"syscall"
)

// Under the race detector the calls are syscall.Read and syscall.Write, which tell it what the
// kernel read and wrote and order a write before the read that sees its bytes (with every
// other socket's in the process, which raw calls could not). Everything around them (the
// poller's waits, the errors) is the same.

// raceBuild: the race detector's build (its calls allocate where the raw ones do not).
const raceBuild = true

func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return result(n, err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return result(n, err)
}

func sysPeek(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, err := syscall.Recvfrom(int(fd), p, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return result(n, err)
}

func result(n int, err error) (int, syscall.Errno) {
	if err == nil {
		return n, 0
	}
	var e syscall.Errno
	if !errors.As(err, &e) {
		e = syscall.EIO
	}
	return 0, e
}
