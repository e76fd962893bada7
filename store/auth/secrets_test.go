package auth_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/store"
)

// The sealed secrets' and fill statuses' cells of the policy (DESIGN.md
// §12): "put secret N" and "read secret N" put and get a secret of N as
// `meshfold secret put` and a provisioner do; "watch secrets ace" watches
// ace's keys as ace's provisioner does; "list secrets" reads every key
// (`secret ls`); "register key N" puts N's curve key registration;
// "write fill status N" puts a status of N's; "read fill status" reads
// every node's (fleet, state, the console), "read fill status ace" ace's
// (its provisioner, on start). The buckets are created by
// the reconciler in the fixture.

const secretPath = "/run/mesh-build-go/broker.creds"

// setupSecrets creates both buckets as the reconciler and puts one
// sealed secret for ace and for shanks as the operator.
func setupSecrets(t *testing.T, s *secured, cfg store.StreamConfig) {
	t.Helper()
	ctx := testCtx(t)
	_, rjs := s.mustConnect(t, "reconciler")
	if _, err := store.OpenSecrets(ctx, rjs, cfg, true); err != nil {
		t.Fatal(err)
	}
	if _, err := store.OpenFillStatus(ctx, rjs, cfg, true); err != nil {
		t.Fatal(err)
	}
	_, ojs := s.mustConnect(t, "operator")
	kv, err := store.OpenSecrets(ctx, ojs, cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"ace", "shanks"} {
		kp, err := nkeys.CreateCurveKeys()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		putSecret(t, ctx, kv, node, pub)
	}
}

func putSecret(t *testing.T, ctx context.Context, kv interface {
	Put(context.Context, string, []byte) (uint64, error)
}, node, pub string) {
	t.Helper()
	rec, err := store.SealSecret(node, "mesh-build-go", secretPath, []byte("matrix"), pub, nil, "alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(rec)
	if _, err := kv.Put(ctx, store.SecretKey(node, "mesh-build-go", secretPath), data); err != nil {
		t.Fatal(err)
	}
}

func secretActions(acts map[string]action) {
	for _, node := range []string{"ace", "shanks"} {
		acts["put secret "+node] = func(ctx context.Context, c *cell) error {
			kv, err := store.OpenSecrets(ctx, c.js, c.cfg, false)
			if err != nil {
				return err
			}
			rec, err := store.SealSecret(node, "mesh-build-go", secretPath, []byte("again"), mustCurvePub(), nil, "alice", time.Now())
			if err != nil {
				return err
			}
			data, _ := json.Marshal(rec)
			_, err = kv.Put(ctx, store.SecretKey(node, "mesh-build-go", secretPath), data)
			return err
		}
		acts["read secret "+node] = func(ctx context.Context, c *cell) error {
			kv, err := store.OpenSecrets(ctx, c.js, c.cfg, false)
			if err != nil {
				return err
			}
			_, err = kv.Get(ctx, store.SecretKey(node, "mesh-build-go", secretPath))
			return err
		}
		acts["register key "+node] = func(ctx context.Context, c *cell) error {
			kv, err := store.OpenSecrets(ctx, c.js, c.cfg, false)
			if err != nil {
				return err
			}
			_, err = kv.Put(ctx, store.CurveKeyName(node), []byte(mustCurvePub()))
			return err
		}
		acts["write fill status "+node] = func(ctx context.Context, c *cell) error {
			kv, err := store.OpenFillStatus(ctx, c.js, c.cfg, false)
			if err != nil {
				return err
			}
			_, err = kv.Put(ctx, store.SecretKey(node, "mesh-build-go", secretPath), []byte(`{"v":1,"state":"missing"}`))
			return err
		}
	}
	acts["watch secrets ace"] = func(ctx context.Context, c *cell) error {
		kv, err := store.OpenSecrets(ctx, c.js, c.cfg, false)
		if err != nil {
			return err
		}
		_, err = store.ReadKV(ctx, kv, "ace.>")
		return err
	}
	acts["list secrets"] = func(ctx context.Context, c *cell) error {
		kv, err := store.OpenSecrets(ctx, c.js, c.cfg, false)
		if err != nil {
			return err
		}
		_, err = store.ReadKV(ctx, kv, ">")
		return err
	}
	acts["read fill status ace"] = func(ctx context.Context, c *cell) error {
		kv, err := store.OpenFillStatus(ctx, c.js, c.cfg, false)
		if err != nil {
			return err
		}
		_, err = store.ReadFillStatus(ctx, kv, "ace")
		return err
	}
	acts["read fill status"] = func(ctx context.Context, c *cell) error {
		kv, err := store.OpenFillStatus(ctx, c.js, c.cfg, false)
		if err != nil {
			return err
		}
		_, err = store.ReadFillStatus(ctx, kv, "")
		return err
	}
}

func mustCurvePub() string {
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		panic(err)
	}
	pub, _ := kp.PublicKey()
	return pub
}
