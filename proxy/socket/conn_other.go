//go:build !linux

package socket

import "net"

// Wrap returns c: raw reads and writes are Linux's only.
func Wrap(c net.Conn) net.Conn { return c }

// Idle reports true: without a peek at the socket a connection's state shows when it is used.
func Idle(net.Conn) bool { return true }
