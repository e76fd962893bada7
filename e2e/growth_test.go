package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
)

// TestStreamGrowth is the steady state of one node (a provisioner and
// four modules with a file each) over resync cycles, with the resync
// intervals of the node agent (a have) and of the provisioner (a refill of
// every file) shortened from 10 minutes to 300 ms: the unchanged refills
// append no filled, so a cycle appends the resync have alone. It logs what
// a cycle appends, from which docs/operations.md gives the growth per day
// at the default settings (144 cycles a day).
func TestStreamGrowth(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("ace")
	mods := []events.WantModule{provisionerMod}
	for i := range 4 {
		name := fmt.Sprintf("app%d", i)
		path := fmt.Sprintf("/etc/%s/key", name)
		mods = append(mods, events.WantModule{Name: name, Build: "b:1", RunsAs: name, Files: []events.File{{Path: path, Mode: "0600"}}})
		n.source(name, path, secret)
	}
	if _, err := m.want(ctx, "ace", mods...); err != nil {
		t.Fatal(err)
	}
	const resync = 300 * time.Millisecond
	rt := n.dirRuntime()
	n.agent = m.spawn("ace-agent", func(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
		a, err := node.New(nc, js, node.Config{Name: "ace", Root: n.root, StateDir: n.state, Runtime: rt,
			Stream: m.cfg, Logger: m.logger("node"), Trust: m.trust, Resync: resync})
		if err != nil {
			return err
		}
		return a.Run(ctx)
	})
	passes := make(chan provision.Report, 64)
	m.spawn("ace-provisioner", func(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
		c, err := provision.New(nc, js, provision.Config{Node: "ace", From: n.from, Account: "prov", Stream: m.cfg,
			Logger: m.logger("provision"), Timeout: 2 * time.Second, Trust: m.trust, Resync: resync,
			OnFill: func(_ uint64, r provision.Report) {
				select {
				case passes <- r:
				default:
				}
			}})
		if err != nil {
			return err
		}
		return c.Run(ctx)
	})
	// Wait for every file to be written once.
	for filled := 0; filled < 4; {
		select {
		case r := <-passes:
			filled += len(r.Filled)
		case <-ctx.Done():
			t.Fatal("the files were not filled")
		}
	}
	type tally struct{ msgs, bytes int }
	read := func(from uint64) (map[events.Kind]tally, uint64) {
		out := map[events.Kind]tally{}
		last := from
		if err := store.ReadNode(ctx, m.js, m.cfg.Name, m.cfg.Subjects(), "ace", from+1, 0, func(msg store.Msg) error {
			t := out[msg.Event.Kind]
			t.msgs++
			t.bytes += len(msg.Data)
			out[msg.Event.Kind] = t
			last = msg.Event.Seq
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out, last
	}
	before, mark := read(0)
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	info0, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const cycles = 10
	for i := 0; i < cycles; {
		select {
		case r := <-passes:
			if len(r.Filled) != 0 {
				t.Fatalf("a refill of unchanged files wrote %d of them", len(r.Filled))
			}
			if len(r.Unchanged) == 4 {
				i++
			}
		case <-ctx.Done():
			t.Fatal("no resync passes")
		}
	}
	info1, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := read(mark)
	if f := after[events.KindFilled]; f.msgs != 0 {
		t.Fatalf("%d filled events appended by %d unchanged refills", f.msgs, cycles)
	}
	total := tally{}
	for k, v := range after {
		total.msgs += v.msgs
		total.bytes += v.bytes
		t.Logf("over %d resync cycles: %s %d messages, %d bytes", cycles, k, v.msgs, v.bytes)
	}
	f := before[events.KindFilled]
	t.Logf("per cycle: %.1f messages of the node, %.0f payload bytes; the stream grew %.1f messages, %.0f stored bytes; a filled's payload is %d bytes (%d in the first fill)",
		float64(total.msgs)/cycles, float64(total.bytes)/cycles,
		float64(info1.State.Msgs-info0.State.Msgs)/cycles, float64(info1.State.Bytes-info0.State.Bytes)/cycles,
		f.bytes/max(f.msgs, 1), f.msgs)
}
