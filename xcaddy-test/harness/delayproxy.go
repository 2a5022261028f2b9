package harness

import (
	"net"
	"sync"
	"testing"
	"time"
)

// DelayProxy forwards TCP connections to a target, holding every byte for
// a fixed delay in each direction, as a server that far away would: a
// round trip through it takes twice the delay more than one to the target.
// Bytes keep their order; throughput is not limited.
type DelayProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
}

// StartDelayProxy listens on a loopback port and forwards to target with
// delay each way; the test's cleanup closes it and every connection.
func StartDelayProxy(t testing.TB, target string, delay time.Duration) *DelayProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &DelayProxy{ln: ln, target: target, delay: delay, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's address.
func (p *DelayProxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines.
func (p *DelayProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *DelayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *DelayProxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(in) {
			return
		}
		p.wg.Go(func() {
			// The connection itself is delayed too: a handshake with a
			// far server takes a round trip.
			time.Sleep(p.delay)
			out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
			if err != nil {
				_ = in.Close()
				return
			}
			time.Sleep(p.delay)
			if !p.track(out) {
				_ = in.Close()
				return
			}
			var both sync.WaitGroup
			both.Go(func() { p.pipe(out, in) })
			both.Go(func() { p.pipe(in, out) })
			both.Wait()
		})
	}
}

// chunk is bytes read at a time, to be written delay after it.
type chunk struct {
	at   time.Time
	data []byte
}

// pipe copies src to dst, each chunk delay after it was read; when either
// side ends, both are closed.
func (p *DelayProxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{time.Now(), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.at.Add(p.delay)))
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	for range q { // let the reader finish
	}
}
