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
	t.Parallel()
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

// A file's fill record lives beside its fill status without being one:
// ReadFillStatus of every node and of the node leaves it out,
// ReadFillRecords reads it back by the file's SecretKey.
func TestFillRecordBesideFillStatus(t *testing.T) {
	t.Parallel()
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := store.OpenFillStatus(ctx, js, cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 4, 15, 40, 1, 0, time.UTC)
	st, _ := json.Marshal(store.FillStatus{V: 1, Node: "ace", Module: "app", Path: "/run/app/c", State: store.FillMissing, Why: "none", Revision: 7, LastFilled: at})
	if _, err := kv.Put(ctx, store.SecretKey("ace", "app", "/run/app/c"), st); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(store.FillRecord{V: 1, Node: "ace", Module: "app", Path: "/run/app/c", Source: "sealed", Revision: 6, Digest: "d", At: at})
	if _, err := kv.Put(ctx, store.FilledKey("ace", "app", "/run/app/c"), rec); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"", "ace"} {
		sts, err := store.ReadFillStatus(ctx, kv, node)
		if err != nil || len(sts) != 1 || sts[0].Revision != 7 || !sts[0].LastFilled.Equal(at) {
			t.Errorf("ReadFillStatus(%q) = %+v, %v; want the one status", node, sts, err)
		}
	}
	recs, err := store.ReadFillRecords(ctx, kv, "ace")
	if r := recs[store.SecretKey("ace", "app", "/run/app/c")]; err != nil || len(recs) != 1 || r.Revision != 6 || r.Source != "sealed" || !r.At.Equal(at) {
		t.Errorf("ReadFillRecords = %+v, %v", recs, err)
	}
}
