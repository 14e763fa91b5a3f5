//go:build !linux

package socket

import "net"

// Wrap returns c: raw reads and writes are Linux's only.
func Wrap(c net.Conn) net.Conn { return c }
