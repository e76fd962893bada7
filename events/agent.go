package events

// KindAgent is the kind of a node agent's liveness transitions (DESIGN.md
// §11 "Liveness"): published by the reconciler, which watches the node
// lease bucket, on <prefix>.<node>.agent.
const KindAgent Kind = "agent"

// AgentState is what an [Agent] event says of the node's agent.
type AgentState string

// Agent states.
const (
	// AgentUp: a node agent claimed the node's lease.
	AgentUp AgentState = "up"
	// AgentDown: the agent's lease ended (see [AgentWhy]).
	AgentDown AgentState = "down"
)

// AgentWhy says how an agent's lease ended.
type AgentWhy string

// Why an agent is down.
const (
	// WhyExpired: the lease was not renewed within its TTL: the agent
	// died (kill -9, a crash, its host lost) or cannot reach the server.
	WhyExpired AgentWhy = "expired"
	// WhyReleased: the agent stopped and gave its lease back.
	WhyReleased AgentWhy = "released"
	// WhyReplaced: another agent claimed the lease (one whose holder was
	// provably dead on the same host, taken at once) before the old
	// claim was seen to end.
	WhyReplaced AgentWhy = "replaced"
)

// MaxClaim bounds an agent event's claim: a lease token is a 22-byte
// NUID.
const MaxClaim = 64

// MaxHost bounds an agent event's host: a host name is at most 253 bytes
// (DNS).
const MaxHost = 253

// Agent records that a node's agent went down or came back (DESIGN.md
// §11 "Liveness"). The reconciler publishes it when it sees the node's
// lease claimed, ended or claimed by another agent, with a deterministic
// message id (<node>.agent.<previous agent event's sequence>.<n>) and the
// previous agent event's sequence as the subject's expected last
// sequence, so a group of reconcilers records each transition once. A
// node's agent events alternate: each claim is up once and down at most
// once.
type Agent struct {
	Header
	State AgentState `json:"state"`
	// Claim identifies the lease claim: the holder's token, random per
	// claim.
	Claim string `json:"claim"`
	// Host and PID are the claim's holder (optional).
	Host string `json:"host,omitempty"`
	PID  int    `json:"pid,omitempty"`
	// Why says how the claim ended; set exactly on a down.
	Why AgentWhy `json:"why,omitempty"`
	// Trusts, on an up, are the reconciler public keys the claim's
	// holder trusts, current and retired, as it read them when it
	// started (its --trust or --trust-from file; the lease's holder
	// record carries them): `meshfold apply` warns of a target whose
	// agent does not trust the key the reconciler signs with. Absent
	// from an older agent's up and from one started with no trust file:
	// unknown, no warning. At most [MaxTrusts], each at most [MaxKey]
	// bytes.
	Trusts []string `json:"trusts,omitempty"`
}

// MaxTrusts bounds an agent event's trusted keys: a trust file names the
// current key and the retired ones of a rotation or two.
const MaxTrusts = 16

// MaxKey bounds a trusted key's text: a public nkey is 56 bytes.
const MaxKey = 64

// Kind implements [Payload].
func (*Agent) Kind() Kind { return KindAgent }

// Validate checks state, claim (required, one line, at most [MaxClaim]
// bytes), host (one line, at most [MaxHost] bytes), pid (not negative)
// and why (one of its values on a down, absent on an up).
func (a *Agent) Validate() error {
	if err := a.header().validate(); err != nil {
		return err
	}
	switch a.State {
	case AgentUp, AgentDown:
	case "":
		return fieldErr("state", "", ErrMissing)
	default:
		return fieldErr("state", string(a.State), ErrBadValue)
	}
	if err := checkText("claim", a.Claim, true, true, MaxClaim, "MaxClaim"); err != nil {
		return err
	}
	if err := checkText("host", a.Host, false, true, MaxHost, "MaxHost"); err != nil {
		return err
	}
	if a.PID < 0 {
		return fieldErr("pid", "", ErrBadValue)
	}
	if len(a.Trusts) > MaxTrusts || len(a.Trusts) > 0 && a.State != AgentUp {
		return fieldErr("trusts", "", ErrBadValue)
	}
	for _, k := range a.Trusts {
		if err := checkText("trusts", k, true, true, MaxKey, "MaxKey"); err != nil {
			return err
		}
	}
	switch {
	case a.State == AgentUp && a.Why != "":
		return fieldErr("why", string(a.Why), ErrBadValue)
	case a.State == AgentDown && a.Why == "":
		return fieldErr("why", "", ErrMissing)
	case a.State == AgentDown && a.Why != WhyExpired && a.Why != WhyReleased && a.Why != WhyReplaced:
		return fieldErr("why", string(a.Why), ErrBadValue)
	}
	return nil
}

// KindProv is the kind of a provisioner client's liveness transitions
// (DESIGN.md §11 "Liveness", extended to the provisioner in
// docs/design.md): published by the reconciler, which watches the
// provisioners' leases (key <node>.provisioner of the node lease bucket),
// on <prefix>.<node>.prov.
const KindProv Kind = "prov"

// Prov records that a node's provisioner client went down or came back:
// an [Agent] event of the provisioner's lease, with the same fields,
// rules and exactly-once publishing (message id <node>.prov.<previous
// prov event's sequence>.0), so that a client killed with kill -9 is
// seen: its knocks go unanswered and the statuses it left in the fill
// status bucket are no longer current.
type Prov struct {
	Agent
	// NoPlan, on an up: when the reconciler recorded the up, the stream
	// held no plan of the node (serve --max-age removed it), so the
	// provisioner that came up found none to fill by (optional; absent
	// from older reconcilers). The fold answers it as a have's NoPlan:
	// the node's last plan published again (docs/architecture.md, "A
	// provisioner started after the plan aged out").
	NoPlan bool `json:"no_plan,omitempty"`
	// OldKey, on an up: the node's newest plan in the stream was signed
	// by a key other than the one the reconciler signs with now (a
	// rotation's retired key, which a provisioner started after the
	// rotation's --finish no longer trusts), so the provisioner that came
	// up may refuse it and fill nothing (optional). The fold answers it
	// with the node's last plan published again, signed with the
	// current key.
	OldKey bool `json:"old_key,omitempty"`
	// LookedBefore, with NoPlan or OldKey: the look for the node's plan
	// covered the stream's sequences before this one (as
	// [Have.LookedBefore]): a plan at or after it was published after
	// the look, not lost nor of the old key.
	LookedBefore uint64 `json:"looked_before,omitempty"`
}

// Kind implements [Payload].
func (*Prov) Kind() Kind { return KindProv }

// Validate checks the [Agent] fields, and that no_plan, old_key and
// looked_before come only on an up, no_plan and old_key not together,
// looked_before only with one of them.
func (p *Prov) Validate() error {
	if err := p.Agent.Validate(); err != nil {
		return err
	}
	if p.NoPlan && p.State != AgentUp {
		return fieldErr("no_plan", "true", ErrBadValue)
	}
	if p.OldKey && (p.State != AgentUp || p.NoPlan) {
		return fieldErr("old_key", "true", ErrBadValue)
	}
	if p.LookedBefore != 0 && !p.NoPlan && !p.OldKey {
		return fieldErr("looked_before", "", ErrBadValue)
	}
	return nil
}
