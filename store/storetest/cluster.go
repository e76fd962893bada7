package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// Cluster is n in-process nats-servers forming one JetStream cluster over
// loopback routes: each has its own ServerName (m0, m1, …), its own
// StoreDir in t.TempDir(), a random client port and a free route port.
// Clients reach it over TCP (URLs), so a connection fails over when a
// server stops. Cleanup shuts every server down.
type Cluster struct {
	t testing.TB
	// Servers are the cluster's servers, in start order. A stopped one
	// stays in the slice; see [Cluster.Running].
	Servers []*server.Server
	urls    []string
}

// StartCluster starts an n-server JetStream cluster (n ≥ 1; 3 for R3) on
// 127.0.0.1 and returns once every server accepts clients and the
// JetStream meta group has a leader that every server follows, so a
// replicated stream can be created at once (0.35 s to 8.2 s measured on
// 2 loaded cores: an election may wait out the server's election
// timeout). It fails the test on any error, or after 30 s without a
// meta leader.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("storetest: cluster of %d servers", n)
	}
	ports := freePorts(t, n)
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	return startServers(t, routes, func(i int, o *server.ClusterOpts) { o.Port = ports[i] })
}

// startServers starts len(routes) JetStream servers m0, m1, … on
// 127.0.0.1, each routed to every address of routes, server i's cluster
// listener set by cluster (its port, and what it advertises), and
// returns once every server accepts clients and the JetStream meta group
// has a leader every server follows (StartCluster's wait). It fails the
// test on any error, or after 30 s without a meta leader.
func startServers(t testing.TB, routes []string, cluster func(i int, o *server.ClusterOpts)) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	var routePorts []int
	for i := range routes {
		opts := &server.Options{
			ServerName: fmt.Sprintf("m%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "meshfold-test", Host: "127.0.0.1"},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		}
		cluster(i, &opts.Cluster)
		routePorts = append(routePorts, opts.Cluster.Port)
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("storetest: cluster server %d: %v", i, err)
		}
		s.Start()
		t.Cleanup(s.Shutdown)
		c.Servers = append(c.Servers, s)
	}
	for i, s := range c.Servers {
		if !s.ReadyForConnections(10 * time.Second) {
			// Without a logger the server says nothing of a listener it
			// could not bind (freePorts).
			if s.ClusterAddr() == nil {
				t.Fatalf("storetest: cluster server %s not ready: its route listener (port %d) is not bound", s.Name(), routePorts[i])
			}
			t.Fatalf("storetest: cluster server %s not ready", s.Name())
		}
		c.urls = append(c.urls, s.ClientURL())
	}
	// A meta election whose first campaign finds the routes not yet up
	// waits out the server's election timeout (4–9 s, random) before the
	// next, and a split vote does so again: measured on 2 loaded cores,
	// a cluster was ready after 0.35 s to 8.2 s, and a 10 s bound failed.
	// Two full timeouts and some.
	deadline := time.Now().Add(30 * time.Second)
	for !c.metaReady() {
		if time.Now().After(deadline) {
			t.Fatal("storetest: the cluster elected no JetStream meta leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c
}

// metaReady: one server leads the meta group, sees every server as a
// peer, and every server is current with it.
func (c *Cluster) metaReady() bool {
	leaders := 0
	for _, s := range c.Running() {
		if s.JetStreamIsLeader() {
			leaders++
			if len(s.JetStreamClusterPeers()) < len(c.Servers) {
				return false
			}
		}
		if !s.JetStreamIsCurrent() {
			return false
		}
	}
	return leaders == 1
}

// URLs returns the client URLs of every server, comma separated, as
// `meshfold --server` takes them.
func (c *Cluster) URLs() string { return strings.Join(c.urls, ",") }

// Running returns the servers that have not been stopped.
func (c *Cluster) Running() []*server.Server {
	var out []*server.Server
	for _, s := range c.Servers {
		if s.Running() {
			out = append(out, s)
		}
	}
	return out
}

// Connect opens a TCP connection to the cluster (every server's URL, so it
// fails over), reconnecting forever every 50 ms, and a JetStream context.
// opts come after these defaults and may override them. Cleanup closes
// it.
func (c *Cluster) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectJitter(0, 0)}, opts...)
	nc, err := nats.Connect(c.URLs(), all...)
	if err != nil {
		t.Fatalf("storetest: connect to the cluster: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("storetest: jetstream: %v", err)
	}
	return nc, js
}

// StreamLeader returns the server that leads the stream's replica group
// (global account), or nil when none does right now.
func (c *Cluster) StreamLeader(stream string) *server.Server {
	for _, s := range c.Running() {
		if s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return s
		}
	}
	return nil
}

// StepDown asks the server leading stream (global account) to step down
// ($JS.API.STREAM.LEADER.STEPDOWN.<stream>, through nc), asking again
// every 2 s while no other server leads it, and returns once another
// does: the old leader and the new one, both still running. It fails
// the test after 30 s.
func (c *Cluster) StepDown(nc *nats.Conn, stream string) (from, to *server.Server) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for from == nil {
		if from = c.StreamLeader(stream); from == nil {
			if time.Now().After(deadline) {
				c.t.Fatalf("storetest: %s has no leader to step down after 30 s", stream)
			}
			time.Sleep(20 * time.Millisecond) // the pace of the looks, not a wait for an event
		}
	}
	for {
		if time.Now().After(deadline) {
			c.t.Fatalf("storetest: %s still led by %s 30 s after its stepdown was asked", stream, from.Name())
		}
		if _, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil, 2*time.Second); err != nil {
			c.t.Logf("storetest: %s's stepdown: %v", stream, err)
		}
		for asked := time.Now(); time.Since(asked) < 2*time.Second; {
			if to = c.StreamLeader(stream); to != nil && to != from {
				return from, to
			}
			time.Sleep(20 * time.Millisecond) // the pace of the looks, not a wait for an event
		}
	}
}

// Follower returns a server of a cluster of three or more that does not
// lead the stream now (the last server, or the one before it when the
// last leads): a replica to hold behind its leader ([Lag.Hold]).
func (c *Cluster) Follower(stream string) *server.Server {
	held := c.Servers[len(c.Servers)-1]
	if held == c.StreamLeader(stream) {
		held = c.Servers[len(c.Servers)-2]
	}
	return held
}

// StartClusterStream is [StartCluster] with n servers, a connection
// ([Cluster.Connect]) and [store.EnsureStream] with cfg (give it Replicas:
// 3 for R3). It returns the stream and its effective configuration too.
func StartClusterStream(t testing.TB, n int, cfg store.StreamConfig) (*Cluster, *nats.Conn, jetstream.JetStream, jetstream.Stream, store.StreamConfig) {
	t.Helper()
	c := StartCluster(t, n)
	nc, js := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, eff, err := store.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatalf("storetest: ensure stream on the cluster: %v", err)
	}
	return c, nc, js, stream, eff
}
