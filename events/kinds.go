package events

import (
	"fmt"
	"slices"
)

// EffectKinds are the kinds the reconciler publishes, the fold's effects
// (DESIGN.md §3): plans, knocks and journal entries. Its plans are inputs
// too (see [InputKinds]).
var EffectKinds = []Kind{KindPlan, KindKnock, KindJournal}

// Effect reports whether k is one of [EffectKinds].
func (k Kind) Effect() bool { return slices.Contains(EffectKinds, k) }

// Input reports whether k is one of [InputKinds]: a kind the reconciler
// folds.
func (k Kind) Input() bool { return slices.Contains(InputKinds, k) }

// Operator reports whether k is one of [OperatorKinds].
func (k Kind) Operator() bool { return slices.Contains(OperatorKinds, k) }

// By returns the `by` of an operator event's payload (an [Approve],
// [Pause], [Resume], [Poke], [Revoke], [Waive], [Retire], [Ack] or
// [Gate]: every kind of [OperatorKinds]); ok is false for every other
// payload.
func By(p Payload) (by string, ok bool) {
	switch p := p.(type) {
	case *Approve:
		return p.By, true
	case *Pause:
		return p.By, true
	case *Resume:
		return p.By, true
	case *Poke:
		return p.By, true
	case *Revoke:
		return p.By, true
	case *Waive:
		return p.By, true
	case *Retire:
		return p.By, true
	case *Ack:
		return p.By, true
	case *Gate:
		return p.By, true
	}
	return "", false
}

// Attribute checks an operator event's payload against the operator its
// subject names (by, from [Subjects.ParseBy]; empty for a plain
// subject, whose `by` is self-declared): the payload's `by` must be by.
//
// Errors: a *FieldError on "by" wrapping [ErrNotPublisher] (and
// [ErrInvalid]).
func Attribute(p Payload, by string) error {
	if by == "" || p == nil {
		return nil
	}
	if got, ok := By(p); !ok || got != by {
		return &FieldError{Field: "by", Value: got, Err: fmt.Errorf("%w (%s)", ErrNotPublisher, by)}
	}
	return nil
}
