package events

import "slices"

// EffectKinds are the kinds the reconciler publishes, the fold's effects
// (DESIGN.md §3): plans, knocks and journal entries. Its plans are inputs
// too (see [InputKinds]).
var EffectKinds = []Kind{KindPlan, KindKnock, KindJournal}

// Effect reports whether k is one of [EffectKinds].
func (k Kind) Effect() bool { return slices.Contains(EffectKinds, k) }

// Input reports whether k is one of [InputKinds]: a kind the reconciler
// folds.
func (k Kind) Input() bool { return slices.Contains(InputKinds, k) }
