package events_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
)

// An agent's up may list the reconciler keys its holder trusts; an older
// agent's up omits them (unknown), and a down never carries them.
func TestAgentTrusts(t *testing.T) {
	key := "NAYT" + strings.Repeat("A", 52)
	for _, c := range []struct {
		name string
		data string
		want []string
		err  error
	}{
		{"absent (an older agent)", `{"v":1,"at":"2026-12-05T05:00:00Z","state":"up","claim":"c1"}`, nil, nil},
		{"listed", `{"v":1,"at":"2026-12-05T05:00:00Z","state":"up","claim":"c1","trusts":["` + key + `"]}`, []string{key}, nil},
		{"on a down", `{"v":1,"at":"2026-12-05T05:00:00Z","state":"down","claim":"c1","why":"expired","trusts":["` + key + `"]}`, nil, events.ErrBadValue},
		{"empty key", `{"v":1,"at":"2026-12-05T05:00:00Z","state":"up","claim":"c1","trusts":[""]}`, nil, events.ErrMissing},
		{"too long", `{"v":1,"at":"2026-12-05T05:00:00Z","state":"up","claim":"c1","trusts":["` + strings.Repeat("N", events.MaxKey+1) + `"]}`, nil, events.ErrTooLong},
	} {
		p, err := events.Decode(events.KindAgent, []byte(c.data))
		if !errors.Is(err, c.err) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
			continue
		}
		if err == nil && !slices.Equal(p.(*events.Agent).Trusts, c.want) {
			t.Errorf("%s: trusts %q, want %q", c.name, p.(*events.Agent).Trusts, c.want)
		}
	}
}
