package rollout_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// TestDecode: every rollout event encodes and decodes to itself; a
// decoder ignores a field it does not know, the strict one refuses it;
// validation names the field.
func TestDecode(t *testing.T) {
	one := rollout.Duration(0).Ptr()
	for _, p := range []any{
		&rollout.Start{By: "alice", Pages: 2, Params: rollout.Params{Batch: rollout.Amount{N: 25, Percent: true}, MinHealthy: one, AutoRevert: true},
			Wants: [][]events.WantModule{{{Name: "web", Build: "b2", Files: []events.File{{Path: "/etc/web.key", Mode: "0600"}}}}},
			Nodes: []rollout.NodeAtStart{{Node: "ace", Want: 1, Prev: 3}, {Node: "bob", Down: true, Unhealthy: []string{"db"}}}},
		&rollout.Nodes{Rollout: 9, Page: 1, Nodes: []rollout.NodeAtStart{{Node: "cat", Want: 1, Prev: 4}}},
		&rollout.Published{Rollout: 9, Node: "ace", Step: rollout.StepForward, Want: 12},
		&rollout.Refused{Rollout: 9, Node: "ace", Step: rollout.StepRevert, Error: "no message at 3"},
		rollout.NewOperator(rollout.KindPromote, 9, "alice", "canary looks good"),
		rollout.NewOperator(rollout.KindAbort, 0, "bob", ""),
		&rollout.Tick{Rollout: 9},
		&rollout.Record{Rollout: 9, Cause: 14, Node: "ace", What: "done", Level: events.LevelInfo, Msg: "target ace done"},
	} {
		rollout.Stamp(p, base)
		k := kindOf(p)
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := rollout.Decode(k, b)
		if err != nil {
			t.Fatalf("%s: %v\n%s", k, err, b)
		}
		if !reflect.DeepEqual(got, p) {
			t.Fatalf("%s: decoded %+v, want %+v", k, got, p)
		}
		extra := strings.Replace(string(b), "{", `{"newer":1,`, 1)
		if _, err := rollout.Decode(k, []byte(extra)); err != nil {
			t.Errorf("%s with an unknown field: %v", k, err)
		}
		if _, err := rollout.DecodeStrict(k, []byte(extra)); !errors.Is(err, events.ErrMalformed) {
			t.Errorf("%s strict with an unknown field: %v", k, err)
		}
	}
	for _, c := range []struct {
		kind rollout.Kind
		json string
		want string
	}{
		{rollout.KindStart, `{"v":1,"at":"2026-12-01T20:00:00Z","by":"a","pages":1,"rollout":{"batch":"150%"},"wants":[],"nodes":[]}`, "batch 150%"},
		{rollout.KindStart, `{"v":1,"at":"2026-12-01T20:00:00Z","by":"a","pages":1,"wants":[[{"name":"web","build":""}]],"nodes":[]}`, "wants[0].modules[0].build: required"},
		{rollout.KindStart, `{"v":1,"at":"2026-12-01T20:00:00Z","by":"a","pages":1,"wants":[],"nodes":[{"node":"ace","want":2}]}`, "nodes[0].want"},
		{rollout.KindStart, `{"v":1,"at":"2026-12-01T20:00:00Z","by":"a","pages":1,"wants":[],"nodes":[{"node":"ace"},{"node":"ace"}]}`, "nodes[1].node \"ace\": declared twice"},
		{rollout.KindPublished, `{"v":1,"at":"2026-12-01T20:00:00Z","rollout":3,"node":"ace","step":"sideways","want":4}`, "step \"sideways\""},
		{rollout.KindPause, `{"v":1,"at":"2026-12-01T20:00:00Z","by":"a\nb"}`, "by"},
		{rollout.KindTick, `{"v":1,"at":"2026-12-01T21:00:00+01:00"}`, "at"},
		{"sideways", `{}`, "unknown event kind"},
	} {
		_, err := rollout.Decode(c.kind, []byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: error %v, want %q", c.kind, c.json, err, c.want)
		}
	}
}

func kindOf(p any) rollout.Kind {
	switch p := p.(type) {
	case *rollout.Start:
		return rollout.KindStart
	case *rollout.Nodes:
		return rollout.KindNodes
	case *rollout.Published:
		return rollout.KindPublished
	case *rollout.Refused:
		return rollout.KindRefused
	case *rollout.Operator:
		return p.Kind()
	case *rollout.Tick:
		return rollout.KindTick
	case *rollout.Record:
		return rollout.KindRecord
	}
	return ""
}
