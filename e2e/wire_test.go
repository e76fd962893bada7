package e2e

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
)

// Wire compatibility one version behind and one ahead (docs/architecture.md,
// "Upgrades without a flag day"). The repository has no release tag to
// build, so the golden stream is the recorded wire fixture: the plans,
// knocks and journal entries of today's reconciler, the haves, settles,
// refusals and filled of today's node agent, and the wants and operator
// events of today's CLI. DESIGN.md §3: decoders ignore fields they do not
// know, so a newer build adds fields without changing `v`; a newer `v` is
// journaled as not understood (the golden holds one).

// goldenUnknown are the fields the golden run's hand-made events carry
// that no build knows: those events are not today's encoding.
var goldenUnknown = []string{`"from_the_future"`, `"added_later"`}

func handMade(data []byte) bool {
	for _, f := range goldenUnknown {
		if bytes.Contains(data, []byte(f)) {
			return true
		}
	}
	return false
}

// TestWireRoundTrip: every node event of the golden decodes with today's
// decoder and, unless hand-made with unknown fields, encodes back to its
// exact bytes: a build of today writes what the build of the golden
// wrote, so a peer one version behind reads it as it read its own.
func TestWireRoundTrip(t *testing.T) {
	t.Parallel()
	eachGolden(t, func(t *testing.T, g golden) { wireRoundTrip(t, g.msgs) })
}

func wireRoundTrip(t *testing.T, msgs []goldenMsg) {
	subj := events.Subjects{}
	n := map[events.Kind]int{}
	for _, m := range msgs {
		_, kind, err := subj.Parse(m.Subject)
		if err != nil {
			continue // a rollout subject: TestGoldenReplay's controller reads them
		}
		p, err := events.Decode(kind, m.Data)
		if err != nil {
			if !handMade(m.Data) {
				t.Errorf("#%d %s: %v", m.Seq, kind, err)
			}
			continue
		}
		if handMade(m.Data) {
			continue
		}
		b := must(events.Encode(p))(t)
		if !bytes.Equal(b, m.Data) {
			t.Errorf("#%d %s: today's encoding\n\t%s\nthe golden's\n\t%s", m.Seq, kind, b, m.Data)
		}
		n[kind]++
	}
	for _, k := range []events.Kind{events.KindPlan, events.KindSettle, events.KindRefusal, events.KindFilled, events.KindHave, events.KindKnock} {
		if n[k] == 0 {
			t.Errorf("no %s round-tripped", k)
		}
	}
}

// withNewerFields returns data, a JSON object, with a field no build knows
// added to it and to every object inside it, as a newer build may add
// fields (DESIGN.md §3).
func withNewerFields(t testing.TB, data []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var add func(v any)
	add = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for _, c := range x {
				add(c)
			}
			x["zz_added_by_a_newer_build"] = map[string]any{"n": 1, "s": []any{"x"}}
		case []any:
			for _, c := range x {
				add(c)
			}
		}
	}
	add(v)
	return must(json.Marshal(v))(t)
}

// TestWireAgentAhead: a node agent (and a CLI) one version ahead of the
// reconciler adds fields to its haves, settles, refusals, filled, wants
// and operator events; today's reconciler folds the golden stream with
// such fields in every input event to exactly the golden's effects and
// states.
func TestWireAgentAhead(t *testing.T) {
	t.Parallel()
	eachGolden(t, func(t *testing.T, g golden) { wireAgentAhead(t, g.msgs, g.snaps) })
}

func wireAgentAhead(t *testing.T, msgs []goldenMsg, snaps []goldenKV) {
	foldGolden(t, msgs, snaps, func(kind events.Kind, b []byte) []byte {
		if kind == events.KindPlan {
			return b // the reconciler's own plans: TestWireAgentBehind
		}
		return withNewerFields(t, b)
	})
}

// TestWireAgentBehind: a reconciler one version ahead of the node agent
// adds fields to its plans and knocks. Today's decoder (what the agent
// and the provisioner read them with) gives the golden's payloads; and
// today's agent, given a newer reconciler's plan (the golden's plan of cy
// with fields added everywhere, signed by the reconciler's key), applies
// it and settles it.
func TestWireAgentBehind(t *testing.T) {
	t.Parallel()
	eachGolden(t, func(t *testing.T, g golden) { wireAgentBehind(t, g.msgs) })
}

func wireAgentBehind(t *testing.T, msgs []goldenMsg) {
	subj := events.Subjects{}
	var plan *goldenMsg
	for i, m := range msgs {
		node, kind, err := subj.Parse(m.Subject)
		if err != nil || (kind != events.KindPlan && kind != events.KindKnock) {
			continue
		}
		want := must(events.Decode(kind, m.Data))(t)
		got, err := events.Decode(kind, withNewerFields(t, m.Data))
		if err != nil {
			t.Fatalf("#%d %s with newer fields: %v", m.Seq, kind, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("#%d %s with newer fields decodes to\n\t%+v\nnot\n\t%+v", m.Seq, kind, got, want)
		}
		if node == "cy" && kind == events.KindPlan {
			plan = &msgs[i]
		}
	}
	if plan == nil {
		t.Fatal("the golden has no plan of cy")
	}

	// A fresh server with the golden's keys and its stream up to that
	// plan (a plan's cause is below its own sequence), no reconciler.
	m := replayGolden(t, msgs[:plan.Seq-1], nil)
	ctx := m.ctx()
	data := withNewerFields(t, plan.Data)
	id := plan.Headers.Get(jetstream.MsgIDHeader)
	msg := nats.NewMsg(m.cfg.Subjects().Event("cy", events.KindPlan))
	msg.Header.Set(jetstream.MsgIDHeader, id)
	if err := m.signer.Sign(msg.Header, "cy", events.KindPlan, id, data); err != nil {
		t.Fatal(err)
	}
	msg.Data = data
	ack := must(m.js.PublishMsg(ctx, msg))(t)
	if ack.Sequence != plan.Seq {
		t.Fatalf("the newer plan stored at #%d, the golden's at #%d", ack.Sequence, plan.Seq)
	}
	cy := m.newNode("cy")
	cy.startAgent(nil)
	s, err := m.settled(ctx, "cy", ack.Sequence)
	if err != nil {
		t.Fatalf("%v; logs:\n%s", err, m.logs.String())
	}
	if s.Op != events.OpApply {
		t.Fatalf("settle %+v, want an apply of plan #%d", s, ack.Sequence)
	}
	runs := must(cy.runs(ctx))(t)
	p := must(events.Decode(events.KindPlan, plan.Data))(t).(*events.Plan)
	for _, pm := range p.Modules {
		if r, ok := runs[pm.Name]; !ok || r.Build != pm.Build {
			t.Errorf("%s: runs %+v, want build %s", pm.Name, r, pm.Build)
		}
	}
	t.Logf("today's agent settled plan #%d of a newer reconciler (%s) in the golden's wire format", ack.Sequence, strconv.Quote(string(data[:min(len(data), 80)])))
}
