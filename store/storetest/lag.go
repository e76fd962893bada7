package storetest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Lag holds a server of a cluster started by [StartLaggingCluster]
// behind its peers: while held, the bytes of its routes that carry the
// system account (where the servers' Raft groups replicate every stream
// and the JetStream metadata) wait in a proxy, while its routes of the
// other accounts (clients' messages, JetStream API requests and their
// answers) flow. The held server stays up, keeps answering its clients
// and keeps its direct-get subscriptions, with the copy of each stream it
// had: a replica behind its leader, as a slow disk, a busy CPU or a
// congested link makes one, for as long as the test wants.
type Lag struct {
	mu      sync.Mutex
	held    string        // the held server's name; "" none
	release chan struct{} // closed when the hold ends
	closed  bool
}

// Hold holds server name's replication until [Lag.Release].
func (l *Lag) Hold(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held, l.release = name, make(chan struct{})
}

// Release lets the held server's replication flow again.
func (l *Lag) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.release != nil {
		close(l.release)
	}
	l.held, l.release = "", nil
}

// wait blocks while a hold applies to a route between from and to of
// the system account.
func (l *Lag) wait(c *proxied) {
	for {
		l.mu.Lock()
		held, release, closed := l.held, l.release, l.closed
		l.mu.Unlock()
		if closed || held == "" || !c.system() || (c.owner != held && c.dialer() != held) {
			return
		}
		<-release
	}
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

func (c *proxied) system() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Contains(c.first, []byte(`"route_account":"`+server.DEFAULT_SYSTEM_ACCOUNT+`"`))
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
		if lag.release != nil {
			close(lag.release)
			lag.release = nil
		}
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
	pipe := func(dst, src net.Conn, c *proxied, sniff bool) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				if sniff {
					c.sniff(buf[:k])
				}
				lag.wait(c)
				if _, werr := dst.Write(buf[:k]); werr != nil {
					return
				}
			}
			if err != nil {
				if err != io.EOF {
					return
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
	c := &Cluster{t: t}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("m%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster: server.ClusterOpts{
				Name:      "meshfold-test",
				Host:      "127.0.0.1",
				Port:      real[i],
				Advertise: strings.TrimPrefix(routes[i], "nats-route://"),
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("storetest: cluster server %d: %v", i, err)
		}
		s.Start()
		t.Cleanup(s.Shutdown)
		c.Servers = append(c.Servers, s)
	}
	for _, s := range c.Servers {
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("storetest: cluster server %s not ready", s.Name())
		}
		c.urls = append(c.urls, s.ClientURL())
	}
	deadline := time.Now().Add(30 * time.Second)
	for !c.metaReady() {
		if time.Now().After(deadline) {
			t.Fatal("storetest: the cluster elected no JetStream meta leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
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
