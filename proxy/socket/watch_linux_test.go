package socket

import (
	"net"
	"testing"
	"time"
)

// fired is a Watcher function that reports its run.
func fired() (func(), chan struct{}) {
	ran := make(chan struct{}, 1)
	return func() { ran <- struct{}{} }, ran
}

// mustAdd watches c with a function that reports its run.
func mustAdd(t *testing.T, w *Watcher, c net.Conn) (token uint64, ran chan struct{}) {
	t.Helper()
	f, ran := fired()
	token, ok := w.Add(c, f)
	if !ok {
		t.Fatal("Add refused a TCP connection")
	}
	return token, ran
}

func waitRan(t *testing.T, ran chan struct{}, what string) {
	t.Helper()
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the function did not run", what)
	}
}

func notRan(t *testing.T, ran chan struct{}, what string) {
	t.Helper()
	select {
	case <-ran:
		t.Fatalf("%s: the function ran", what)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestWatcher: a watched connection's function runs once it has a byte to read or its peer
// closed it (at once when it had one before it was added), and not before; a registration
// removed first never runs; a connection that is not a socket is refused; after Close, Add
// fails and Remove reports what was still registered as removed.
func TestWatcher(t *testing.T) {
	w, err := NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	t.Run("a byte", func(t *testing.T) {
		c, s := pair(t)
		_, ran := mustAdd(t, w, Wrap(s))
		notRan(t, ran, "nothing to read")
		_, _ = c.Write([]byte("x"))
		waitRan(t, ran, "a byte")
		notRan(t, ran, "once") // one-shot: a second byte starts nothing
	})
	t.Run("the peer's close", func(t *testing.T) {
		c, s := pair(t)
		_, ran := mustAdd(t, w, wrapper{s})
		_ = c.Close()
		waitRan(t, ran, "close")
	})
	t.Run("readable before", func(t *testing.T) {
		c, s := pair(t)
		_, _ = c.Write([]byte("x"))
		time.Sleep(20 * time.Millisecond)
		_, ran := mustAdd(t, w, s)
		waitRan(t, ran, "readable at Add")
	})
	t.Run("removed first", func(t *testing.T) {
		c, s := pair(t)
		tok, ran := mustAdd(t, w, s)
		if !w.Remove(tok) {
			t.Fatal("Remove before any byte: false")
		}
		_, _ = c.Write([]byte("x"))
		notRan(t, ran, "removed")
		if w.Remove(tok) {
			t.Error("a second Remove: true")
		}
		// The connection can be watched again (its registration was deleted).
		_, ran2 := mustAdd(t, w, s)
		waitRan(t, ran2, "watched again")
	})
	t.Run("after it ran", func(t *testing.T) {
		c, s := pair(t)
		tok, ran := mustAdd(t, w, s)
		_, _ = c.Write([]byte("x"))
		waitRan(t, ran, "a byte")
		if w.Remove(tok) {
			t.Error("Remove after the function ran: true")
		}
	})
	t.Run("not a socket", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		if _, ok := w.Add(a, func() {}); ok {
			t.Error("Add took a pipe")
		}
	})

	_, s := pair(t)
	tok, ran := mustAdd(t, w, s)
	w.Close()
	if !w.Remove(tok) {
		t.Error("Remove after Close: false for a registration that never ran")
	}
	if _, ok := w.Add(s, func() {}); ok {
		t.Error("Add after Close: true")
	}
	notRan(t, ran, "closed")
}
