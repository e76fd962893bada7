package events_test

import (
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
)

// benchPayloads are one event of each kind of the benchmarks' mix
// (engine/enginetest's Simulate: the shapes of its want, have, settle,
// refusal, filled writes, and the plan and knock the fold gives them),
// stamped as the simulator stamps them.
func benchPayloads() []events.Payload {
	at := time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC)
	digest := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ps := []events.Payload{
		&events.Have{Modules: []events.HaveModule{
			{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"},
			{Name: "postgres", Build: "pg:b3", State: events.Running, Account: "postgres"},
			{Name: "restic", Build: "r:b3", State: events.Running, Account: "restic"},
			{Name: "power", Build: "w:1", State: events.Running, Account: "power"},
		}},
		&events.Settle{Module: "postgres", Op: events.OpApply, Plan: 123456},
		&events.Refusal{Module: "restic", Path: "/etc/restic/new", Reason: events.ReasonUndeclared, Plan: 123456, Writer: "prov"},
		&events.Filled{Module: "postgres", Path: "/etc/postgres/pw", Plan: 123456, Digest: digest},
		&events.Want{Modules: []events.WantModule{
			{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
			{Name: "postgres", Build: "pg:b3", RunsAs: "postgres", Files: []events.File{{Path: "/etc/postgres/pw", Mode: "0600"}}},
			{Name: "restic", Build: "r:b3", RunsAs: "restic", Files: []events.File{{Path: "/etc/restic/key", Mode: "0600"}}},
			{Name: "power", Build: "w:1", RunsAs: "power"},
		}},
		// Rows without files as compose emits them: Files nil, written
		// "files":null (until issue 27's fix every such plan took the
		// general decoder; this bench wrote [] and did not show it).
		&events.Plan{Cause: 123457, Want: 123457, ProvisionerAccount: "prov", Modules: []events.PlanModule{
			{Name: "power", Build: "w:1", RunsAs: "power"},
			{Name: "postgres", Build: "pg:b3", RunsAs: "postgres", Files: []events.File{{Path: "/etc/postgres/pw", Mode: "0600"}}},
			{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
			{Name: "restic", Build: "r:b3", RunsAs: "restic", Files: []events.File{{Path: "/etc/restic/key", Mode: "0600"}}},
		}},
		&events.Knock{Cause: 123458, Reasons: []events.KnockReason{events.KnockDeclared}, Owed: []events.Owed{
			{Module: "restic", Path: "/etc/restic/new", Reason: events.ReasonUndeclared, Plan: 123456, Writer: "prov"},
		}},
	}
	for _, p := range ps {
		events.Stamp(p, at)
	}
	return ps
}

// BenchmarkDecodeKind decodes and validates one event of each kind of
// the benchmarks' mix ([events.Decode], as the reconciler calls it for
// every message it folds); one op is one event.
func BenchmarkDecodeKind(b *testing.B) {
	for _, p := range benchPayloads() {
		data, err := events.Encode(p)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(string(p.Kind()), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := events.Decode(p.Kind(), data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecoderKind is [BenchmarkDecodeKind] through a
// [events.Decoder] keeping its strings, as the reconciler's sessions
// decode.
func BenchmarkDecoderKind(b *testing.B) {
	for _, p := range benchPayloads() {
		data, err := events.Encode(p)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(string(p.Kind()), func(b *testing.B) {
			d := &events.Decoder{Strings: map[string]string{}, Max: 1 << 14}
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := d.Decode(p.Kind(), data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
