package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A provisioner's knock answer lives beside its node's fill statuses
// without being one: ReadFillStatus of every node and of the node leaves
// it out, GetKnockAnswer and ReadKnockAnswers read it back.
func TestKnockAnswerBesideFillStatus(t *testing.T) {
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := store.OpenFillStatus(ctx, js, cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := json.Marshal(store.FillStatus{V: 1, Node: "ace", Module: "app", Path: "/run/app/c", State: store.FillMissing, Why: "none"})
	if _, err := kv.Put(ctx, store.SecretKey("ace", "app", "/run/app/c"), st); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 4, 0, 0, 0, time.UTC)
	if err := store.PutKnockAnswer(ctx, kv, store.KnockAnswer{Node: "ace", Account: "prov", Knock: 9, Cause: 8, At: at}); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"", "ace"} {
		sts, err := store.ReadFillStatus(ctx, kv, node)
		if err != nil || len(sts) != 1 || sts[0].Module != "app" {
			t.Errorf("ReadFillStatus(%q) = %+v, %v; want the one status", node, sts, err)
		}
	}
	a, ok, err := store.GetKnockAnswer(ctx, kv, "ace")
	if err != nil || !ok || a.Knock != 9 || a.Cause != 8 || a.Account != "prov" || !a.At.Equal(at) {
		t.Errorf("GetKnockAnswer = %+v %v %v", a, ok, err)
	}
	if _, ok, err := store.GetKnockAnswer(ctx, kv, "bob"); ok || err != nil {
		t.Errorf("GetKnockAnswer of a node with none: %v %v", ok, err)
	}
	all, err := store.ReadKnockAnswers(ctx, kv, "")
	if err != nil || len(all) != 1 || all["ace"].Knock != 9 {
		t.Errorf("ReadKnockAnswers = %+v, %v", all, err)
	}
}
