package console_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// F3 on a real stream through the read side (query.Reader): the stored
// snapshots are from before ace's newest want and bob's first event, and
// every checkpoint is before both, as a serve killed -9 leaves them. The
// console, started afterwards, shows ace's newest want and bob, read live
// from the state service, though neither has another event.
func TestConsoleReadsLiveWhatTheSnapshotsLagOnAStream(t *testing.T) {
	t.Parallel()
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	s.Append("ace", &events.Want{Modules: []events.WantModule{provisioner}})
	stored := s.State("ace").Clone()
	checkpoint := s.Next() - 1
	want := s.Append("ace", &events.Want{Modules: []events.WantModule{provisioner, mbgMod}})
	s.Append("bob", &events.Want{Modules: []events.WantModule{provisioner}})
	subj := cfg.Subjects()
	for _, ev := range s.Events {
		data, err := s.Data(ev)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, subj.Event(ev.Node, ev.Kind), data)
		if err != nil || ack.Sequence != ev.Seq {
			t.Fatalf("publish #%d: %v (acked %v)", ev.Seq, err, ack)
		}
	}
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	data, err := reconcile.MarshalState(stored)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := reconcile.MarshalSummary(stored)
	if err != nil {
		t.Fatal(err)
	}
	if err := snaps.PutSummarizedAt(ctx, events.Partition("ace", cfg.Partitions), map[string][]byte{"ace": data}, map[string][]byte{"ace": sum}, nil); err != nil {
		t.Fatal(err)
	}
	for p := range cfg.Partitions {
		if err := snaps.PutCheckpoint(ctx, p, checkpoint); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := engine.AddStateService(nc, func(node string) (*reconcile.State, bool) {
		if node != "ace" && node != "bob" {
			return nil, false
		}
		return s.State(node).Clone(), true
	}, engine.StateServiceConfig{}); err != nil {
		t.Fatal(err)
	}
	r, err := query.New(nc, query.Config{Stream: cfg, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{Source: r})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	srv := httptest.NewServer(c)
	defer func() {
		srv.Close()
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	fx := &fixture{srv: srv}
	body := fx.waitPage(t, "/", `id="node-bob"`)
	body = fx.waitPage(t, "/", fmt.Sprintf("#%d", want.Seq))
	if row := regexp.MustCompile(`(?s)<tr id="node-ace".*?</tr>`).FindString(body); !strings.Contains(row, fmt.Sprintf("#%d", want.Seq)) {
		t.Errorf("ace's row does not show its want #%d, stored past the checkpoint #%d:\n%s", want.Seq, checkpoint, row)
	}
}
