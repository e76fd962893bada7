package storetest

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on loopback in front of a server's client port,
// for tests of a connection lost with requests under way: a client
// connected through it ([Proxy.URL]) sends while the proxy holds what it
// sends ([Proxy.Hold]: received, never delivered, as a server that went
// away does), then loses its connection ([Proxy.Drop]) and reconnects
// through the proxy, which passes everything again. [Proxy.Stall] holds
// every byte in both directions, on every connection, until
// [Proxy.Resume] sends them on in order: nothing is closed and the server
// runs on (its timers too: a bucket's TTL expires its keys), as a server
// whose clients are starved behind a load answers nobody for seconds
// while its clock runs; no client reconnects for a stall shorter than its
// ping interval (2 min by default). Cleanup resumes and closes it.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   []net.Conn // both ends of every live connection
	hold    bool
	held    []byte        // what clients sent while held
	stalled chan struct{} // closed on Resume; nil: not stalled
}

// StartProxy starts a proxy to target (host:port).
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("storetest: proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target}
	t.Cleanup(p.close)
	go p.accept()
	return p
}

// URL is the proxy's client URL.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Hold keeps what clients send from now on: nothing more reaches the
// server (its answers to what it had still come back).
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = true
}

// Holds reports whether what clients sent while held contains b (a
// subject, say).
func (p *Proxy) Holds(b string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.held, []byte(b))
}

// Drop closes every connection through the proxy, dropping what it held,
// and ends the hold: a client sees its server gone and reconnects.
func (p *Proxy) Drop() {
	p.mu.Lock()
	conns := p.conns
	p.conns, p.hold, p.held = nil, false, nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Stall holds what both ends send, on every connection, until Resume.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Resume sends on what the stall held, and everything after it.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

func (p *Proxy) close() {
	p.Resume()
	p.ln.Close()
	p.Drop()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(s, c, true)
		go p.pipe(c, s, false)
	}
}

// pipe copies from src to dst until either closes; what a client sends
// (fromClient) while held is kept instead, and anything read while
// stalled waits for Resume.
func (p *Proxy) pipe(dst, src net.Conn, fromClient bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			held := fromClient && p.hold
			if held {
				p.held = append(p.held, buf[:n]...)
			}
			stalled := p.stalled
			p.mu.Unlock()
			if stalled != nil {
				<-stalled
			}
			if !held {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return // EOF, or the other end closed
		}
	}
}
