package rollout

import (
	"strings"
	"testing"
)

// CanaryCoversAll warns of a canary batch that holds every target, and
// only of that.
func TestCanaryCoversAll(t *testing.T) {
	for _, c := range []struct {
		canary  Amount
		targets int
		want    string // "" : no warning
	}{
		{Amount{}, 4, ""},
		{Amount{N: 1}, 4, ""},
		{Amount{N: 3}, 4, ""},
		{Amount{N: 50, Percent: true}, 4, ""},
		{Amount{N: 9}, 4, "canary 9 is more than the 4 targets (cut to 4): every target is a canary"},
		{Amount{N: 4}, 4, "canary 4 holds all 4 targets: every target is a canary"},
		{Amount{N: 100, Percent: true}, 4, "canary 100% holds all 4 targets"},
		{Amount{N: 1}, 1, "canary 1 holds the only target"},
		{Amount{N: 9}, 0, ""},
	} {
		got := Params{Canary: c.canary}.CanaryCoversAll(c.targets)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("canary %s of %d targets: %q, want %q", c.canary, c.targets, got, c.want)
		}
	}
}
