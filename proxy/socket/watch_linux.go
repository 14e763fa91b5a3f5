package socket

import (
	"net"
	"os"
	"sync"
	"syscall"
)

// A Watcher tells when connections nothing reads have something to read (bytes, or their
// end), for all of them with one goroutine and one epoll instance of its own: a server that
// must notice a client going away mid-answer otherwise keeps a goroutine blocked in a read
// for every such connection (a stack and a goroutine descriptor each; the runtime never frees
// descriptors, so a burst of streams leaves them behind).
//
// Each connection is registered once (EPOLLONESHOT): the first readiness runs its function in
// a goroutine of its own and ends the registration. The epoll instance's descriptor waits in
// Go's own poller (an epoll descriptor is readable while it has events), so the goroutine
// blocks no thread.
type Watcher struct {
	epoll *os.File
	rc    syscall.RawConn
	done  chan struct{}

	mu     sync.Mutex
	next   uint64
	conns  map[uint64]watched
	closed bool
	once   sync.Once
}

type watched struct {
	rc syscall.RawConn
	f  func()
}

// NewWatcher starts a Watcher; Close stops it.
func NewWatcher() (*Watcher, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, os.NewSyscallError("setnonblock", err)
	}
	f := os.NewFile(uintptr(fd), "socket-watcher")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	w := &Watcher{epoll: f, rc: rc, done: make(chan struct{}), conns: map[uint64]watched{}}
	go w.run()
	return w, nil
}

// Add watches c, which nothing reads until f has run or Remove returned: f runs once, in a
// goroutine of its own, when c has bytes to read or ended (at once if it has or did already).
// It returns the registration's token for Remove; ok is false when c cannot be watched (not
// a TCP or Unix socket, or wrapped in a way Wrap does not see through; or the Watcher
// closed): the caller then watches it itself.
func (w *Watcher) Add(c net.Conn, f func()) (token uint64, ok bool) {
	rc := rawOf(c)
	if rc == nil {
		return 0, false
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return 0, false
	}
	w.next++
	token = w.next
	w.conns[token] = watched{rc: rc, f: f}
	w.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: int32(token), Pad: int32(token >> 32)}
	if err := w.ctl(rc, syscall.EPOLL_CTL_ADD, &ev); err != nil {
		w.mu.Lock()
		delete(w.conns, token) // no event comes for a registration that failed
		w.mu.Unlock()
		return 0, false
	}
	return token, true
}

// Remove ends the watch of token and reports whether it ended before its function was
// started: false means the function runs (or ran).
func (w *Watcher) Remove(token uint64) bool {
	w.mu.Lock()
	e, ok := w.conns[token]
	delete(w.conns, token)
	w.mu.Unlock()
	if ok {
		_ = w.ctl(e.rc, syscall.EPOLL_CTL_DEL, nil)
	}
	return ok
}

// Close stops the Watcher: functions not yet started never run, and Remove still reports
// them removed (true); Add fails from now on.
func (w *Watcher) Close() {
	w.once.Do(func() {
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
		_ = w.epoll.Close() // ends run's wait
		<-w.done
	})
}

// ctl changes the registration of the socket under rc, holding both descriptors (neither
// can be closed and its number reused meanwhile; a closed one fails the call).
func (w *Watcher) ctl(rc syscall.RawConn, op int, ev *syscall.EpollEvent) error {
	var err error
	cerr := w.rc.Control(func(epfd uintptr) {
		if e := rc.Control(func(fd uintptr) {
			err = syscall.EpollCtl(int(epfd), op, int(fd), ev)
		}); e != nil {
			err = e
		}
	})
	if cerr != nil {
		return cerr
	}
	return err
}

// run waits for events and starts the functions of their registrations, until Close.
func (w *Watcher) run() {
	defer close(w.done)
	events := make([]syscall.EpollEvent, 128)
	for {
		var n int
		err := w.rc.Read(func(fd uintptr) bool {
			for {
				var e error
				n, e = syscall.EpollWait(int(fd), events, 0)
				if e == syscall.EINTR {
					continue
				}
				return n > 0 || e != nil // none: wait on Go's poller until some come
			}
		})
		if err != nil {
			return // closed
		}
		for i := range n {
			token := uint64(uint32(events[i].Fd)) | uint64(uint32(events[i].Pad))<<32
			w.mu.Lock()
			e, ok := w.conns[token]
			delete(w.conns, token)
			w.mu.Unlock()
			if !ok {
				continue // removed meanwhile
			}
			_ = w.ctl(e.rc, syscall.EPOLL_CTL_DEL, nil) // a one-shot registration stays until deleted
			go e.f()
		}
	}
}

// rawOf is the raw connection under c: Wrap's, without a new lookup, else rawConn's.
func rawOf(c net.Conn) syscall.RawConn {
	if sc, ok := c.(*Conn); ok {
		return sc.rd.rc
	}
	return rawConn(c)
}
