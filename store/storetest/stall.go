package storetest

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// StallProxy is a TCP proxy on loopback in front of one NATS server, for
// clients that connect through it ([StallProxy.URL]): [StallProxy.Stall]
// holds every byte in both directions, on every connection, until
// [StallProxy.Resume] sends them on, in order. Nothing is closed and the
// server runs on (its timers too: a bucket's TTL expires its keys), as a
// server whose clients' reads and writes are starved behind a load
// answers nobody for seconds while its clock runs. No client reconnects
// for a stall shorter than its ping interval (2 min by default).
// Cleanup resumes it and closes its listener and connections.
type StallProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	stalled chan struct{} // closed when not stalled; nil: not stalled
	conns   []net.Conn
	closed  bool
}

// StartStallProxy starts a proxy to the server at url ("nats://host:port").
func StartStallProxy(t testing.TB, url string) *StallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("storetest: stall proxy: %v", err)
	}
	p := &StallProxy{ln: ln, target: strings.TrimPrefix(url, "nats://")}
	t.Cleanup(p.close)
	go p.accept()
	return p
}

// URL returns the proxy's client URL.
func (p *StallProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Stall holds every connection's traffic until Resume.
func (p *StallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Resume sends on what the stall held, and everything after it.
func (p *StallProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// gate returns the channel to wait on before forwarding: nil when not
// stalled.
func (p *StallProxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalled
}

func (p *StallProxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies src to dst, each read held while the proxy is stalled.
func (p *StallProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if g := p.gate(); g != nil {
				<-g
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *StallProxy) close() {
	p.Resume()
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}
