// Package socket reads and writes a TCP connection with raw system calls, and watches many
// connections nothing reads with one goroutine (Watcher, epoll).
//
// A read or write on a net.Conn is a system call the runtime is told about (entersyscall).
// Telling it has a cost a proxy pays on every request: when every processor was idle (a
// gateway between two requests) the runtime's monitor thread sleeps, and the first such system
// call wakes it (Go 1.26's entersyscall); awake, it polls every 20 µs for as long as any
// processor is busy, and backs off only after a millisecond in which it found nothing to do —
// a thread woken every 20 µs of every request. And a write that lasts past one of the
// monitor's ticks (on loopback, and on a busy host, the kernel delivers the data to the
// receiver inside the sender's write) can have its processor taken away and handed to another
// thread (a futex wake-up).
//
// Go's sockets are non-blocking (its poller made them so): a read or write never waits for
// anything but the kernel's own work, so a raw system call (syscall.RawSyscall, which the
// runtime neither hands off nor counts) is safe; when there is nothing to read or no room to
// write the call returns EAGAIN, and Conn waits on the poller as net.Conn does, with the
// connection's deadlines. What it costs: a goroutine in a raw call cannot be preempted, so a
// stop of the world (a collection's start) waits for the call to end; each call is bounded
// (maxIO bytes, tens of microseconds on loopback).
//
// On Linux only; elsewhere Wrap returns the connection as it is. Under the race detector the
// calls are syscall.Read and syscall.Write (the detector learns from them what the kernel read
// and wrote, and that a write happens before the read that sees its bytes), in the same Conn.
package socket
