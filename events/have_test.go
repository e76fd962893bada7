package events_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
)

// The have's runtime fields (DESIGN.md §8) are additive: validated when
// present, optional, and unknown to an older decoder without harm.
func TestHaveRuntimeFields(t *testing.T) {
	const head = `{"v":1,"at":"2026-01-02T03:04:05Z","modules":[{"name":"a","build":"b","state":"failed"`
	for _, tc := range []struct {
		name  string
		extra string
		err   error
		field string
	}{
		{"none", ``, nil, ""},
		{"all", `,"restarts":4,"fill_restarts":2,"exit":"status 1","since":"2026-01-02T03:04:00.123Z","health":"unhealthy"`, nil, ""},
		{"starting", `,"health":"starting"`, nil, ""},
		{"healthy", `,"health":"healthy"`, nil, ""},
		{"unknown health", `,"health":"fine"`, events.ErrBadValue, "modules[0].health"},
		{"health with newline", `,"health":"healthy\nforged"`, events.ErrBadValue, "modules[0].health"},
		{"negative restarts", `,"restarts":-1`, events.ErrBadValue, "modules[0].restarts"},
		{"negative fill restarts", `,"fill_restarts":-1`, events.ErrBadValue, "modules[0].fill_restarts"},
		{"exit with newline", `,"exit":"status 1\nforged line"`, events.ErrBadExit, "modules[0].exit"},
		{"exit too long", `,"exit":"` + strings.Repeat("x", events.MaxExit+1) + `"`, events.ErrBadExit, "modules[0].exit"},
		{"zero since", `,"since":"0001-01-01T00:00:00Z"`, events.ErrMissing, "modules[0].since"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := events.Decode(events.KindHave, []byte(head+tc.extra+`}]}`))
			if tc.err == nil {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				return
			}
			var fe *events.FieldError
			if !errors.Is(err, tc.err) || !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("Decode: %v, want %v on %s", err, tc.err, tc.field)
			}
		})
	}
}

func TestHaveRuntimeFieldsRoundTrip(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := events.Stamp(&events.Have{Modules: []events.HaveModule{{Name: "a", Build: "b", State: events.Failed, Restarts: 2, Exit: "signal SIGKILL", Since: &since, Health: events.Unhealthy}}}, since)
	data, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	p, err := events.Decode(events.KindHave, data)
	if err != nil {
		t.Fatal(err)
	}
	got := p.(*events.Have).Modules[0]
	if got.Restarts != 2 || got.Exit != "signal SIGKILL" || got.Since == nil || !got.Since.Equal(since) || got.Health != events.Unhealthy {
		t.Fatalf("round trip: %+v", got)
	}
	// A module without them encodes as before: the fields are omitted.
	plain, _ := json.Marshal(events.HaveModule{Name: "a", Build: "b", State: events.Running})
	if s := string(plain); strings.Contains(s, "restarts") || strings.Contains(s, "exit") || strings.Contains(s, "since") || strings.Contains(s, "health") {
		t.Errorf("a have module without runtime fields encodes them: %s", s)
	}
}

// A have's missing files (a file deleted on the node, a fresh user's
// finding U21) are optional: a have without them decodes as before, one
// with them is validated, and a knock may say reason missing.
func TestHaveMissingFiles(t *testing.T) {
	const head = `{"v":1,"at":"2026-01-02T03:04:05Z","modules":[{"name":"a","build":"b","state":"failed"}]`
	for _, tc := range []struct {
		name  string
		extra string
		want  []events.MissingFile
		err   error
		field string
	}{
		{"absent (an older agent)", ``, nil, nil, ""},
		{"one", `,"missing":[{"module":"a","path":"/run/a/key"}]`, []events.MissingFile{{Module: "a", Path: "/run/a/key"}}, nil, ""},
		{"two", `,"missing":[{"module":"a","path":"/run/a/ca"},{"module":"a","path":"/run/a/key"}]`,
			[]events.MissingFile{{Module: "a", Path: "/run/a/ca"}, {Module: "a", Path: "/run/a/key"}}, nil, ""},
		{"bad path", `,"missing":[{"module":"a","path":"run/a/key"}]`, nil, events.ErrBadPath, "missing[0].path"},
		{"bad module", `,"missing":[{"module":"A","path":"/run/a/key"}]`, nil, events.ErrBadName, "missing[0].module"},
		{"twice", `,"missing":[{"module":"a","path":"/k"},{"module":"a","path":"/k"}]`, nil, events.ErrDuplicate, "missing[1].path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := events.Decode(events.KindHave, []byte(head+tc.extra+`}`))
			if tc.err != nil {
				var fe *events.FieldError
				if !errors.Is(err, tc.err) || !errors.As(err, &fe) || fe.Field != tc.field {
					t.Fatalf("err = %v, want %v at %s", err, tc.err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.(*events.Have).Missing; !slices.Equal(got, tc.want) {
				t.Fatalf("missing = %v, want %v", got, tc.want)
			}
		})
	}
	k := `{"v":1,"at":"2026-01-02T03:04:05Z","cause":5,"reasons":["missing"],"owed":[]}`
	if _, err := events.Decode(events.KindKnock, []byte(k)); err != nil {
		t.Fatalf("a knock with reason missing: %v", err)
	}
}
