//go:build linux && !race

package socket

import (
	"syscall"
	"unsafe"
)

const raceBuild = false

// sysRead is one raw read(2) of p (not empty).
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

// sysWrite is one raw write(2) of p (not empty).
func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

// sysPeek is one non-blocking recv(2) of p with MSG_PEEK: what is waiting, left in place.
func sysPeek(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return int(n), e
}
