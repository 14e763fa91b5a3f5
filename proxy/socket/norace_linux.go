//go:build linux && !race

package socket

import (
	"syscall"
	"unsafe"
)

const raceBuild = false

// sysRead is one raw recv(2) of p (not empty): read(2)'s effect on a socket, without the
// file layer read(2) goes through first (the file position's lookup, the generic read's
// checks), as nginx reads.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), 0, 0, 0)
	return int(n), e
}

// sysWrite is one raw send(2) of p (not empty): write(2)'s effect on a socket without the file
// layer, and with MSG_NOSIGNAL: a write to a connection the peer reset fails with EPIPE and
// raises no SIGPIPE for the runtime to field.
func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), syscall.MSG_NOSIGNAL, 0, 0)
	return int(n), e
}

// sysPeek is one non-blocking recv(2) of p with MSG_PEEK: what is waiting, left in place.
func sysPeek(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return int(n), e
}
