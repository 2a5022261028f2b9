package caddyfairqueue

import (
	"io"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// bodyWatchPeriod is how often the bodies being received are looked at: a
// body past its deadline is ended within this much of it.
const bodyWatchPeriod = 50 * time.Millisecond

// bodies bounds the time to receive request bodies, for every handler of
// the process. Nearly every body arrives long before its deadline, often
// with the request's header: a timer per request cost each one a timer's
// set-up and tear-down (two updates of the connection's read deadline, or
// a time.AfterFunc where there is no connection) for the rare body that
// is late. Instead, a body being read is linked into a list, and one
// goroutine, running only while some list is not empty, ends those past
// their deadline every bodyWatchPeriod. The lists are sharded by address,
// so that requests on different cores seldom take the same lock.
var bodies bodyWatch

const bodyShards = 16

type bodyWatch struct {
	shards  [bodyShards]bodyShard
	running atomic.Bool // the goroutine is started and not yet gone
}

type bodyShard struct {
	mu   sync.Mutex
	head *bodyRead // the bodies being read, newest first
	_    [48]byte  // a cache line each
}

// bodyRead is one body being received, from watch to its done. It lives
// in the request's admission: watching costs the request no allocation.
type bodyRead struct {
	prev, next *bodyRead
	deadline   time.Time
	// conn is the writer that sets the connection's read deadline; body is
	// closed instead where the connection takes none (a recorder in tests,
	// a writer that does not unwrap).
	conn readDeadliner
	body io.Closer
	// fired is set when the deadline passed while the body was being
	// read: the read that failed then failed for the timeout, which the
	// closed body's error does not say.
	fired  atomic.Bool
	listed bool
}

// readDeadliner is what http.ResponseController.SetReadDeadline looks for.
type readDeadliner interface{ SetReadDeadline(time.Time) error }

// watch starts bounding r's body by deadline; done must follow.
func (b *bodyRead) watch(w http.ResponseWriter, r *http.Request, deadline time.Time) {
	*b = bodyRead{deadline: deadline, conn: readDeadlineOf(w), body: r.Body}
	bodies.add(b)
}

// done stops watching. A deadline that fired stays on the connection, so
// that net/http's own drain of an unread body is bounded too (the server
// resets deadlines per request only when it is configured to).
func (b *bodyRead) done() { bodies.remove(b) }

// timedOut reports whether the body's deadline passed while it was read.
func (b *bodyRead) timedOut() bool { return b.fired.Load() }

// fire ends a read past its deadline: a read blocked on the connection
// returns a timeout; without a connection deadline, the body is closed.
func (b *bodyRead) fire(now time.Time) {
	b.fired.Store(true) // before the read it ends can look
	if b.conn != nil && b.conn.SetReadDeadline(now) == nil {
		return
	}
	_ = b.body.Close()
}

// readDeadlineOf finds the writer that sets the connection's read
// deadline, unwrapping as http.ResponseController does, without its
// allocations (the controller, and an error built when there is none).
func readDeadlineOf(w http.ResponseWriter) readDeadliner {
	for {
		switch t := w.(type) {
		case readDeadliner:
			return t
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return nil
		}
	}
}

func (w *bodyWatch) shard(b *bodyRead) *bodyShard {
	// Admissions are allocated far enough apart that their addresses'
	// middle bits spread them over the shards.
	return &w.shards[(uintptr(unsafe.Pointer(b))>>8)%bodyShards]
}

func (w *bodyWatch) add(b *bodyRead) {
	sh := w.shard(b)
	sh.mu.Lock()
	b.next, b.prev, b.listed = sh.head, nil, true
	if sh.head != nil {
		sh.head.prev = b
	}
	sh.head = b
	sh.mu.Unlock()
	if !w.running.Load() && w.running.CompareAndSwap(false, true) {
		go w.run()
	}
}

// remove unlinks b. Under the lock, so a fire in progress ends before the
// read's caller goes on.
func (w *bodyWatch) remove(b *bodyRead) {
	sh := w.shard(b)
	sh.mu.Lock()
	if b.listed {
		if b.prev != nil {
			b.prev.next = b.next
		} else {
			sh.head = b.next
		}
		if b.next != nil {
			b.next.prev = b.prev
		}
		b.prev, b.next, b.listed = nil, nil, false
	}
	sh.mu.Unlock()
}

// run ends the reads past their deadline until none is being watched. A
// panic is logged and the goroutine ends; the next read starts another.
func (w *bodyWatch) run() {
	t := time.NewTicker(bodyWatchPeriod)
	defer t.Stop()
	defer func() {
		if err := recover(); err != nil {
			w.running.Store(false)
			caddy.Log().Named("http.handlers.fair_queue.bodies").Error("panic watching request bodies",
				zap.Any("error", err), zap.ByteString("stack", debug.Stack()))
		}
	}()
	for now := range t.C {
		if w.sweep(now) {
			continue
		}
		// Nothing watched: go. A read added since its shard was swept,
		// by a caller that saw this goroutine running, is seen by the
		// second sweep, and then this goroutine stays, unless a caller
		// that saw it gone has started another already.
		w.running.Store(false)
		if !w.sweep(now) || !w.running.CompareAndSwap(false, true) {
			return
		}
	}
}

// sweep fires the reads past their deadline at now; false when none is
// being watched.
func (w *bodyWatch) sweep(now time.Time) bool {
	any := false
	for i := range w.shards {
		sh := &w.shards[i]
		sh.mu.Lock()
		for b := sh.head; b != nil; b = b.next {
			any = true
			if !b.fired.Load() && !now.Before(b.deadline) {
				b.fire(now)
			}
		}
		sh.mu.Unlock()
	}
	return any
}
