package storetest

import (
	"bytes"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Lag holds a server of a cluster started by [StartLaggingCluster]
// behind its peers: while held, the Raft append entries that carry
// entries of every stream's replica group ($NRG.AE.S-…), and the
// catchups ($NRG.CR.…), that its routes carry wait in a proxy, while
// everything else flows: the leaders' heartbeats (so the held replica
// keeps its leader and never campaigns), clients' messages, JetStream API
// requests and their answers, the metadata group's replication (so
// consumers are still created). The held server stays up, keeps
// answering its clients and keeps its direct-get subscriptions, with the
// copy of each stream it had: a replica behind its leader, as a slow
// disk, a busy CPU or a congested link makes one, for as long as the test
// wants. [Lag.Release] sends what waited, in order.
type Lag struct {
	mu     sync.Mutex
	held   string // the held server's name; "" none
	closed bool
}

// Hold holds server name's replication until [Lag.Release].
func (l *Lag) Hold(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = name
}

// holding reports whether a server is held.
func (l *Lag) holding() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held != "" && !l.closed
}

// opLen returns the length of the route protocol operation at the start
// of b (its line, and for a message its payload and CRLF), or 0 when b
// does not hold all of it yet.
func opLen(b []byte) int {
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 {
		return 0
	}
	n := i + 2
	if bytes.HasPrefix(b, []byte("RMSG ")) || bytes.HasPrefix(b, []byte("HMSG ")) {
		f := bytes.Fields(b[:i])
		size, err := strconv.Atoi(string(f[len(f)-1]))
		if err != nil {
			return n // not a message line after all: pass it on
		}
		n += size + 2
		if len(b) < n {
			return 0
		}
	}
	return n
}

// Release lets the held server's replication flow again.
func (l *Lag) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = ""
}

// holds reports whether an operation of route connection c waits now:
// a stream group's append entry while c's server or its dialer is held.
func (l *Lag) holds(c *proxied, op []byte) bool {
	if !bytes.HasPrefix(op, []byte("RMSG ")) && !bytes.HasPrefix(op, []byte("HMSG ")) {
		return false
	}
	line, payload, _ := bytes.Cut(op, []byte("\r\n"))
	switch {
	case bytes.Contains(line, []byte(" $NRG.AE.S-")):
		if bytes.HasPrefix(op, []byte("RMSG ")) && heartbeat(payload) {
			return false
		}
	case bytes.Contains(line, []byte(" $NRG.CR.")):
		// A catchup's entries, which a heartbeat past the replica's end
		// asks for.
	default:
		return false
	}
	l.mu.Lock()
	held, closed := l.held, l.closed
	l.mu.Unlock()
	return !closed && held != "" && (c.owner == held || c.dialer() == held)
}

// heartbeat reports whether payload, an append entry's (nats-server
// 2.15's encoding: leader id 8 bytes, term, commit, previous term and
// index 8 bytes each, then the number of entries, 2 bytes, little
// endian), carries no entry: a leader's heartbeat. Heartbeats reach a
// held replica, so that it keeps its leader and never campaigns: a
// replica that hears no leader for its election timeout (4-9 s) does,
// its higher term deposes the leader (the Raft has no pre-vote), and on
// a loaded machine, where a hold outlasts the timeout, the stream had
// no leader for most of a minute.
func heartbeat(payload []byte) bool {
	const countAt = 8 + 4*8
	return len(payload) >= countAt+2 && payload[countAt] == 0 && payload[countAt+1] == 0
}

// proxied is one route connection through a server's proxy: its dialer's
// first bytes (CONNECT and INFO) say which server dialed and for which
// account.
type proxied struct {
	owner string // the server behind the proxy
	mu    sync.Mutex
	first []byte
}

func (c *proxied) sniff(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.first) < 16<<10 {
		c.first = append(c.first, b[:min(len(b), 16<<10-len(c.first))]...)
	}
}

func (c *proxied) dialer() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, rest, ok := bytes.Cut(c.first, []byte(`"server_name":"`))
	if !ok {
		return ""
	}
	name, _, _ := bytes.Cut(rest, []byte(`"`))
	return string(name)
}

// StartLaggingCluster is [StartCluster] whose servers' routes pass
// through proxies of the test (each server advertises its proxy, so
// every route to it, configured or learnt, passes there), and the [Lag]
// that can hold one server behind the others.
func StartLaggingCluster(t testing.TB, n int) (*Cluster, *Lag) {
	t.Helper()
	if n < 1 {
		t.Fatalf("storetest: cluster of %d servers", n)
	}
	lag := &Lag{}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	real := freePorts(t, n)
	var lns []net.Listener
	var routes []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("storetest: proxy: %v", err)
		}
		lns = append(lns, ln)
		routes = append(routes, "nats-route://"+ln.Addr().String())
	}
	// Registered before the servers start, so run after they stop.
	t.Cleanup(func() {
		lag.mu.Lock()
		lag.closed = true
		lag.mu.Unlock()
		for _, ln := range lns {
			ln.Close()
		}
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	// pipe copies src to dst one route protocol operation at a time
	// (a line, and a message's payload after it), keeping back those the
	// hold holds until it ends. Reads wake every 20 ms to send what a
	// released hold kept back.
	pipe := func(dst, src net.Conn, c *proxied, sniff bool) {
		defer dst.Close()
		defer src.Close()
		var in, kept []byte
		buf := make([]byte, 32<<10)
		for {
			_ = src.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			k, err := src.Read(buf)
			if sniff && k > 0 {
				c.sniff(buf[:k])
			}
			in = append(in, buf[:k]...)
			var out []byte
			for {
				n := opLen(in)
				if n == 0 {
					break
				}
				op := in[:n]
				if lag.holds(c, op) {
					kept = append(kept, op...)
				} else {
					out = append(out, op...)
				}
				in = in[n:]
			}
			if len(kept) > 0 && !lag.holding() {
				out, kept = append(kept, out...), nil
			}
			if len(out) > 0 {
				if _, werr := dst.Write(out); werr != nil {
					return
				}
			}
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				return
			}
		}
	}
	for i, ln := range lns {
		owner, target := fmt.Sprintf("m%d", i), fmt.Sprintf("127.0.0.1:%d", real[i])
		go func() {
			for {
				in, err := ln.Accept()
				if err != nil {
					return
				}
				out, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					in.Close()
					continue
				}
				mu.Lock()
				conns = append(conns, in, out)
				mu.Unlock()
				c := &proxied{owner: owner}
				go pipe(out, in, c, true)
				go pipe(in, out, c, false)
			}
		}()
	}
	c := startServers(t, routes, func(i int, o *server.ClusterOpts) {
		o.Port = real[i]
		o.Advertise = strings.TrimPrefix(routes[i], "nats-route://")
	})
	return c, lag
}

// WaitDirectGets waits (up to 30 s) until every running server answers
// direct gets of stream: a follower subscribes to them only once it has
// caught up, which it checks every 2 s (nats-server 2.15), so right after
// a stream is created only its leader answers them. A test of what a
// replica answers waits for this first. It fails the test on timeout.
func (c *Cluster) WaitDirectGets(stream string) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		all := true
		for _, s := range c.Running() {
			sz, err := s.Subsz(&server.SubszOptions{Subscriptions: true, Account: server.DEFAULT_GLOBAL_ACCOUNT,
				Test: "$JS.API.DIRECT.GET." + stream + ".x", Limit: 1000})
			if err != nil {
				c.t.Fatalf("storetest: subscriptions of %s: %v", s.Name(), err)
			}
			found := false
			for _, sub := range sz.Subs {
				found = found || sub.Queue != ""
			}
			all = all && found
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("storetest: not every server answers direct gets of %s after 30 s", stream)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
