package console

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// BenchmarkFleetIndex100k makes the fleet page's index (every row made,
// sorted and counted per need) of 100,000 nodes: views of 1,000 nodes of
// the bench's mix, each reused under 100 names: the copy under the lock
// and the making in the background after a change of the fleet.
func BenchmarkFleetIndex100k(b *testing.B) {
	const distinct, n = 1000, 100000
	names := make([]string, distinct)
	for i := range names {
		names[i] = fmt.Sprintf("t%04d", i)
	}
	s := reconciletest.Scripted(names, 20*distinct, 17, nil)
	f := newFleet(nil, slog.New(slog.DiscardHandler))
	for i := range n {
		v := s.State(names[i%distinct]).View()
		v.Node = fmt.Sprintf("node-%06d", i)
		f.views[v.Node] = NodeView{Node: v.Node, View: v}
	}
	now := s.TimeOf(s.Next()).Add(time.Minute)
	for b.Loop() {
		f.mu.Lock()
		in := f.indexInput(now)
		f.mu.Unlock()
		in.make(10 * time.Minute)
	}
}
