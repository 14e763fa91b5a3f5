//go:build !linux

package socket

import (
	"errors"
	"net"
)

// Wrap returns c: raw reads and writes are Linux's only.
func Wrap(c net.Conn) net.Conn { return c }

// Idle reports true: without a peek at the socket a connection's state shows when it is used.
func Idle(net.Conn) bool { return true }

// A Watcher is Linux's only: NewWatcher fails elsewhere, and the caller watches each
// connection itself.
type Watcher struct{}

// NewWatcher fails: no Watcher outside Linux.
func NewWatcher() (*Watcher, error) { return nil, errors.New("socket: no watcher on this system") }

// Add fails: see NewWatcher.
func (*Watcher) Add(net.Conn, func()) (uint64, bool) { return 0, false }

// Remove reports false: nothing was added.
func (*Watcher) Remove(uint64) bool { return false }

// Close does nothing.
func (*Watcher) Close() {}
