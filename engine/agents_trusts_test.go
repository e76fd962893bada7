package engine_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// An agent's up lists the reconciler keys its lease's holder record says
// it trusts (store.Holder.Trusts, which the node agent writes from its
// trust file), so apply can warn of a target that would refuse the
// reconciler's plans; a record without them (an older agent) gives an up
// without them, and one listing no key's text gives none (the up must
// validate whatever a bucket writer put).
func TestAgentUpListsTrustedKeys(t *testing.T) {
	t.Parallel()
	e, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx := testCtx(t)
	s := startServe(t, e, engine.Config{Stream: cfg})
	s.waitReady(t)
	kv, err := js.KeyValue(ctx, cfg.Name+store.NodeLeaseBucketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	key := "NAYT" + strings.Repeat("A", 52)
	put := func(node string, trusts []string) {
		t.Helper()
		v, _ := json.Marshal(store.Holder{Role: "node", Name: node, Host: "h1", PID: 4242, Token: "c-" + node, Trusts: trusts})
		if _, err := kv.Put(ctx, node, v); err != nil {
			t.Fatal(err)
		}
	}
	put("ace", []string{key})
	put("bob", nil)
	put("cat", []string{"not a key"})
	up := func(node string) ([]string, bool) {
		var got []string
		found := false
		err := store.ReadNode(ctx, js, cfg.Name, cfg.Subjects(), node, 0, 0, func(m store.Msg) error {
			if a, ok := m.Event.Payload.(*events.Agent); ok && a.State == events.AgentUp {
				got, found = a.Trusts, true
			}
			return nil
		})
		return got, err == nil && found
	}
	for node, want := range map[string][]string{"ace": {key}, "bob": nil, "cat": nil} {
		got := waitfor.Value(t, time.Minute, node+"'s up", func() ([]string, bool) { return up(node) })
		if !slices.Equal(got, want) {
			t.Errorf("%s's up lists %q, want %q", node, got, want)
		}
	}
}
