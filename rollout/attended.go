package rollout

import (
	"fmt"
	"time"
)

// UnattendedAfter is how long a step the controller owes a rollout (a
// want decided and not published, a tick due) may wait before
// [State.Unattended] says no controller acts on it. A live controller
// takes such a step within a second (package rollout's duties 2 and 4);
// one that died is replaced by another process within its lease's TTL
// (15 s by default, `serve --lease-ttl`); the rest is room for the clocks
// of the reader and of the stream's server to differ.
const UnattendedAfter = 30 * time.Second

// ControllerFact is one of the controller's own events on the fleet's
// rollout subject: where and when it acted.
type ControllerFact struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Kind is tick, published, refused or record.
	Kind Kind `json:"kind"`
}

// Unattended says that no controller acts on a rollout that owes a step:
// the controller is down, its user revoked, or none was ever started
// (rollouts off). The stream tells it without asking anyone: each step
// the controller owes has a moment (a want decided, a window's or a
// deadline's end), and a live controller acts within a second of it.
type Unattended struct {
	// Due is when the oldest step owed became due, Owed what it is
	// ("bob's new want, decided at #31, is not published").
	Due  time.Time `json:"due"`
	Owed string    `json:"owed"`
	// Last is the controller's newest fact of the rollout; nil when it
	// recorded none since the start. Since is its time, else the start's.
	Last  *ControllerFact `json:"last,omitempty"`
	Since time.Time       `json:"since"`
}

// controllerFact keeps the input as the rollout's newest controller fact
// when it is one of the controller's events of the current rollout.
func (f *folder) controllerFact() {
	r := f.s.Rollout
	if r == nil {
		return
	}
	var id uint64
	var k Kind
	switch p := f.in.Payload.(type) {
	case *Tick:
		id, k = p.Rollout, KindTick
	case *Published:
		id, k = p.Rollout, KindPublished
	case *Refused:
		id, k = p.Rollout, KindRefused
	case *Record:
		id, k = p.Rollout, KindRecord
	default:
		return
	}
	if id == r.ID {
		r.Controller = &ControllerFact{Seq: f.in.Seq, Time: f.in.Time, Kind: k}
	}
}

// Unattended returns, as of now (the reader's clock), what says that no
// controller acts on the rollout: a step it owes has been due for
// [UnattendedAfter] or longer, and it recorded nothing of the rollout
// for as long (its newest fact, or the start when none). Nil otherwise,
// and for a rollout that owes nothing: idle ([State.Idle]: the
// controller only follows the rollout's subjects then), or waiting for
// its nodes or an operator with no deadline of its own due.
//
// A rollout no controller acts on otherwise looks as it does while it
// waits: running, a target publishing, a window never closed (a fresh
// user's finding: an operator saw RUNNING and waited for ever).
func (s *State) Unattended(now time.Time) *Unattended {
	r := s.Rollout
	if r == nil || s.Idle() {
		return nil
	}
	var u Unattended
	owe := func(t time.Time, what string) {
		if u.Owed == "" || t.Before(u.Due) {
			u.Due, u.Owed = t, what
		}
	}
	for _, e := range s.Pending() {
		n := r.Nodes[e.Want.Node]
		switch {
		case e.Want.Step == StepRevert && n.Back != nil && n.Back.Step != nil:
			owe(n.Back.Step.Time, fmt.Sprintf("%s's previous want, given back at #%d, is not published", n.Name, n.Back.Step.Seq))
		case n.Step != nil:
			owe(n.Step.Time, fmt.Sprintf("%s's new want, decided at #%d, is not published", n.Name, n.Step.Seq))
		}
	}
	s.wakes(func(t time.Time, node, what string) {
		owe(t, fmt.Sprintf("%s's %s ended at %s and no tick judged it", node, what, t.UTC().Format(time.RFC3339)))
	})
	if u.Owed == "" || now.Sub(u.Due) < UnattendedAfter {
		return nil
	}
	u.Last, u.Since = r.Controller, r.Time
	if u.Last != nil {
		u.Since = u.Last.Time
	}
	if now.Sub(u.Since) < UnattendedAfter {
		return nil
	}
	return &u
}

// Text says it in one line, with what to check, as of now.
func (u *Unattended) Text(now time.Time) string {
	ago := func(t time.Time) string { return max(now.Sub(t), 0).Round(time.Second).String() }
	since := fmt.Sprintf("it started at %s (%s ago): no controller fact since", u.Since.UTC().Format(time.RFC3339), ago(u.Since))
	if u.Last != nil {
		since = fmt.Sprintf("#%d %s, a %s (%s ago)", u.Last.Seq, u.Last.Time.UTC().Format(time.RFC3339), u.Last.Kind, ago(u.Last.Time))
	}
	return fmt.Sprintf("no rollout controller has acted on this rollout since %s, and one owes it a step since %s (%s ago): %s. "+
		ControllerCheck+" The rollout takes the step once a controller runs",
		since, u.Due.UTC().Format(time.RFC3339), ago(u.Due), u.Owed)
}

// ControllerCheck says what to check when no rollout controller acts on
// a rollout: [Unattended.Text] ends with it, and so does apply's note
// when none recorded the rollout it started.
const ControllerCheck = "Is a 'meshfold serve' or 'meshfold reconcile' running with its rollout controller? Its log says why not " +
	"(rollouts off: reconcile under auth needs --controller-creds; its controller user revoked: 'meshfold auth add-user controller')."
