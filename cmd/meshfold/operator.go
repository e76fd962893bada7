package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// The operator verbs of DESIGN.md §9: each publishes one event per node.

func init() {
	register(newPauseCmd)
	register(newResumeCmd)
	register(newPokeCmd)
	register(newRetireCmd)
	register(newRevokeCmd)
	register(newWaiveCmd)
}

// operatorFlags are the flags every operator verb shares.
type operatorFlags struct {
	by      string
	reason  string
	all     bool
	newNode bool
	ahead   bool // approve, revoke, waive: a module or path the newest want does not declare
	timeout time.Duration
	wait    time.Duration // poke: how long to wait for the provisioners' answers
}

func (o *operatorFlags) add(a *app, cmd *cobra.Command, reason, all bool) {
	addPublishTimeout(cmd, &o.timeout)
	cmd.Flags().StringVar(&o.by, "by", "", "who acts (required, but a named operator's creds give their name); kept in the stream for the audit")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error { return a.settleBy(cmd, &o.by) }
	if reason {
		cmd.Flags().StringVar(&o.reason, "reason", "", "why, for the audit (one line)")
	}
	if all {
		cmd.Flags().BoolVar(&o.all, "all", false, "every node that has a want and is not retired, instead of naming nodes")
	}
}

// settleBy settles an operator verb's --by against the creds it
// connects with. A named operator's creds (user operator-<name>, from
// 'meshfold auth add-operator') publish operator events only on
// subjects that end in their name, which the server checks: --by
// defaults to that name, and another name is refused here (the server
// would refuse the publish). Any other creds (the shared operator's)
// need --by, stored as given: self-declared.
func (a *app) settleBy(cmd *cobra.Command, by *string) error { return a.settleByFor(cmd, by, "") }

// settleByFor is settleBy for a verb whose record the server does not
// check the name of (unchecked says what records it and why: "a sealed
// secret's record (the bucket's key names no operator)"): a named
// operator's creds record their name, and another --by is refused here,
// saying that meshfold refuses it because the server could not. ""
// unchecked is settleBy.
func (a *app) settleByFor(cmd *cobra.Command, by *string, unchecked string) error {
	user, _ := credsUser(a.conn.withEnv().creds)
	named := auth.OperatorOf(user)
	set := cmd.Flags().Changed("by")
	switch {
	case named == "" && !set:
		return withCode(exitUsage, errors.New(`required flag(s) "by" not set: --by NAME says who acts, kept for the audit (a named operator's creds give it: 'meshfold auth add-operator')`))
	case named != "" && !set:
		*by = named
	case named != "" && *by != named && unchecked == "":
		return withCode(exitUsage, fmt.Errorf("--by %q: these creds are operator %s's (user %s), and the server lets them act only as %s: leave --by out, or connect with %s's own creds",
			*by, named, user, named, *by))
	case named != "" && *by != named:
		return withCode(exitUsage, fmt.Errorf("--by %q: these creds are operator %s's (user %s): the server does not check the name %s records, so meshfold records only %s with them: leave --by out, or connect with %s's own creds",
			*by, named, user, unchecked, named, *by))
	}
	return nil
}

// What records a verb's name where the server cannot check it
// (settleByFor): a fleet's rollout subjects and the sealed secrets'
// keys have no token a permission could pin to the operator.
const (
	rolloutUnchecked = "a rollout's event records (its subject, <prefix>.rollout.FLEET.KIND, names no operator)"
	secretUnchecked  = "a sealed secret's record keeps (its key, NODE.MODULE.PATH, names no operator)"
)

// byUncheckedHelp is the paragraph of the --help of the verbs whose
// --by the server cannot check (settleByFor).
const byUncheckedHelp = `--by: a named operator's creds ('meshfold auth add-operator NAME') give
their name, and another --by is refused (exit 2, nothing published): the
server does not check this name, so meshfold does. The shared operator's
creds need --by, kept as typed.`

// namedOperator returns the name of the named operator whose creds the
// verbs connect with (auth.OperatorOf); "" for any other creds.
func (a *app) namedOperator() string {
	user, _ := credsUser(a.conn.withEnv().creds)
	return auth.OperatorOf(user)
}

// addNew adds --new, to the verbs that refuse a node with no want (a
// mistyped name would otherwise make a phantom node that fleet lists);
// known: those that refuse only a node with no event at all (pause,
// resume).
func (o *operatorFlags) addNew(cmd *cobra.Command, known bool) {
	what := "no want"
	if known {
		what = "no event"
	}
	cmd.Flags().BoolVar(&o.newNode, "new", false, "act on a node that has "+what+" in the stream yet (refused without it: a mistyped name would make a phantom node)")
}

// allRetiredHelp is the paragraph of the --help of the verbs that take
// --all (allVerbs) on retired nodes.
const allRetiredHelp = `--all skips the nodes retired or retiring (a retire newer than the node's
newest want) and says on stderr how many it skipped; naming such a node is
refused (exit 1, nothing published to any node named): a want brings it back.`

// knownNodeHelp is newNodeHelp of pause and resume, which refuse only a
// node the stream holds no event of.
const knownNodeHelp = `A node with no event in the stream is refused (exit 2, nothing published):
a mistyped name would make a phantom node that 'meshfold fleet' lists as
needing an operator. A node the stream knows (its agent started, or it
reported a have) may be paused before its first want: the want then waits
for the resume. 'meshfold fleet' lists the nodes; --new acts on a node
with no event anyway.`

// newNodeHelp is the paragraph of the --help of the verbs that take --new.
const newNodeHelp = `A node with no want in the stream is refused (exit 2, nothing published):
a mistyped name would make a phantom node that 'meshfold fleet' lists as
needing an operator. 'meshfold fleet' lists the nodes; --new acts on such a
node anyway.`

func newPauseCmd(a *app) *cobra.Command {
	var o operatorFlags
	cmd := &cobra.Command{
		Use:   "pause NODE... --by NAME [--reason TEXT] | pause --all --by NAME [--reason TEXT]",
		Short: "Stop the reconciler from publishing new plans for nodes",
		Long: `pause publishes a pause event for each node. While a node is paused the
reconciler emits no new plan for it: wants and approvals are still folded and
shown as pending ('meshfold state NODE' lists what resuming would publish),
and knocks still flow, so a credential is never held back. 'meshfold fleet'
shows who paused a node and since when. Undo with 'meshfold resume'.

A node paused already (a pause newer than its newest resume and retire)
gets no event, as the reconciler would ignore a second one: pause prints
"pause NODE: paused already (pause #N by NAME): nothing published" and
exits 1, as 'meshfold rollout pause' does; the other nodes named are
paused. --all skips such nodes (one note on stderr counts them) and exits 1
only when every node is paused already.

Prints each event's stream sequence, one line per node; exit 1 if any
publish failed or any node named is paused already, 2 on a usage error.

` + knownNodeHelp + "\n\n" + allRetiredHelp,
		Example: `  meshfold pause ace --by alice --reason "disk swap"
  meshfold pause new-node --by alice --reason "hold its first want"   # its agent started: the stream knows it
  meshfold pause ace shanks --by alice
  meshfold pause --all --by alice --reason "freeze for the release"`,
		ValidArgsFunction: a.completeNodes(-1),
	}
	return a.operatorVerb(cmd, &o, events.KindPause, true, true, func(args []string) events.Payload {
		return &events.Pause{By: o.by, Reason: o.reason}
	})
}

func newResumeCmd(a *app) *cobra.Command {
	var o operatorFlags
	cmd := &cobra.Command{
		Use:   "resume NODE... --by NAME [--reason TEXT] | resume --all --by NAME [--reason TEXT]",
		Short: "End a pause: publish the plan composed now, once, if it differs",
		Long: `resume publishes a resume event for each node. It ends the node's pause; if
the plan the reconciler composes then differs from the last one it emitted
(a want or an approval taken in while paused), that plan is published, once.
A node that is not paused (no pause newer than its newest resume and retire)
gets no event: resume prints "resume NODE: not paused: nothing published"
and exits 1, as 'meshfold rollout resume' does; the other nodes named are
resumed. --all resumes the paused nodes (one note on stderr counts the
others) and exits 1 only when none is paused.

Prints each event's stream sequence, one line per node; exit 1 if any
publish failed or any node named is not paused, 2 on a usage error.

` + knownNodeHelp + "\n\n" + allRetiredHelp,
		Example: `  meshfold resume ace --by alice
  meshfold resume --all --by alice   # every paused node; exit 1 when none is`,
		ValidArgsFunction: a.completeNodes(-1),
	}
	return a.operatorVerb(cmd, &o, events.KindResume, true, true, func(args []string) events.Payload {
		return &events.Resume{By: o.by, Reason: o.reason}
	})
}

func newPokeCmd(a *app) *cobra.Command {
	var o operatorFlags
	cmd := &cobra.Command{
		Use:   "poke NODE... --by NAME [--reason TEXT] | poke --all --by NAME [--reason TEXT]",
		Short: "Ask the provisioner to fill every file of nodes again",
		Long: `poke publishes a poke event for each node; the reconciler answers it with a
knock of reason "operator", and the node's provisioner client fills every
declared file again (after fixing a secret source, say). A poke pays no owed
item: the node judges the refill as any other write.

Prints each event's stream sequence, one line per node; exit 1 if any
publish failed, 2 on a usage error.

Then it waits (--wait, 5s; 0 does not wait) for each node's provisioner to
take the knock, and says so on stderr ("its provisioner took knock #N within
5ms of the poke"; for several nodes, one line each and then one for all of
them: "8 of 8 provisioners took their knocks, all within 487ms of the pokes",
one wait for all, no figure of each); past half a second it says what it
waits for. A node whose newest plan and newest
want declare no file needs no provisioner: poke says so at once and waits
for none; nor for a node whose provisioner is recorded down
(provisioner-down in 'meshfold fleet'): it says at once since when. Otherwise,
after the wait, it says that none did: "no provisioner
answered within 5s; is 'meshfold provision NODE …' running for NODE?", with
when it last answered; or, when its provisioner refuses the node's plans
and knocks for their signer (a key its --trust does not name), that key and
what to do; or, with no knock at all, that no reconciler published one.
Either way it exits 0: the poke is stored, and a provisioner started later
fills every file on start.
'meshfold state' and 'fleet' show such a knock too (NEEDS source).

` + newNodeHelp + "\n\n" + allRetiredHelp,
		Example: `  meshfold poke ace --by alice --reason "broker creds rotated"
  meshfold poke --all --by alice
  meshfold poke ace --by alice --wait 0   # publish, do not wait for the provisioner`,
		ValidArgsFunction: a.completeNodes(-1),
	}
	return a.operatorVerb(cmd, &o, events.KindPoke, true, true, func(args []string) events.Payload {
		return &events.Poke{By: o.by, Reason: o.reason}
	})
}

func newRetireCmd(a *app) *cobra.Command {
	var o operatorFlags
	var force bool
	cmd := &cobra.Command{
		Use:   "retire NODE... --by NAME [--force] [--reason TEXT]",
		Short: "Remove every module from nodes, then forget them",
		Long: `retire publishes a retire event for each node named. The node's plan
becomes empty (every module removed) and all its owed items are paid; once
the node settles that plan it is retired and leaves 'meshfold fleet' ('fleet
--all' still lists it). Until then fleet shows it as retiring. So a node no
agent runs cannot finish
retiring: retire says so on stderr (the node holds no lease in the node lease
bucket) and how to go on: start its agent, or --force. --force retires it at
once, for a node whose agent is gone for good (the empty plan is still
published, so an agent that comes back removes everything). A later want
brings the node back.

A node the stream holds events of but never a want (a provisioner or agent
started under a mistyped name leaves one, which 'meshfold fleet' lists) is
retired by --force; without it, retire refuses (exit 2, nothing published)
and says so, since no agent would settle its empty plan. A name the stream
holds no event of is refused either way (--new retires it anyway).

Every node named is checked before anything is published: one refused
refuses them all (exit 2, nothing published). There is no --all: retiring
a fleet is spelled out node by node.

Prints each event's stream sequence, one line per node; exit 1 if any
publish failed, 2 on a usage error.`,
		Example: `  meshfold retire shanks --by alice --reason "decommissioned"
  meshfold retire n151 n152 n153 --by alice --reason "rack 7 returned"
  meshfold retire $(seq -f 'n%03g' 151 200) --by alice   # fifty nodes, one command
  meshfold retire shanks --by alice --force
  meshfold retire gus --by alice --force   # a provisioner once ran as gus, a typo: never a want`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: a.completeNodes(-1),
	}
	cmd.Flags().BoolVar(&force, "force", false, "retire at once, without waiting for the node to settle the empty plan")
	return a.operatorVerb(cmd, &o, events.KindRetire, true, false, func(args []string) events.Payload {
		return &events.Retire{By: o.by, Force: force, Reason: o.reason}
	})
}

func newRevokeCmd(a *app) *cobra.Command {
	var o operatorFlags
	cmd := &cobra.Command{
		Use:   "revoke NODE MODULE BUILD --by NAME",
		Short: "Take an approval back",
		Long: `revoke publishes a revoke event: the approval of MODULE at BUILD on NODE is
removed. A module held for that approval stays held; a module already running
that build is not stopped (its want asks for what runs). A module approved but
not yet settled at that build is held again at what runs by the next plan.
(To revoke a NATS user's credentials, see 'meshfold auth revoke'.)

A MODULE the node's newest want does not name (a mistyped name, or a node
with no want yet) is refused, as approve refuses it: exit 2, nothing
published, and the message names the want's modules ("did you mean …?"
when one is close): a typo would leave the approval in force. To take back
an approval given ahead of the want that will name its module, give
--ahead. A revoke of a module the want names but the node's newest plan
does not is published with a note on stderr.

BUILD is checked as approve checks it: a build of no build's form is refused
with exit 2; a sha256: build the builds bucket does not hold with exit 1,
naming the nearest stored (a typo would leave the approval in force).
--allow-missing-build revokes it anyway: the approval of a build removed
since ('meshfold build rm --force') is taken back so. The short form of a
stored build (sha256: and 12 hex digits or more) names it, as for approve.

Prints the event's stream sequence; exit 1 if the publish failed, 2 on a
usage error.

` + newNodeHelp,
		Example: `  meshfold revoke novox nats img:nats-2.10.24 --by alice
  meshfold revoke novox web "$BUILD" --by alice --allow-missing-build   # its bundle was removed since
  meshfold revoke ace nats img:nats-2.11.0 --by alice --ahead   # an approval given --ahead, before a want names nats`,
		Args:              cobra.ExactArgs(3),
		ValidArgsFunction: a.completeNodes(1),
	}
	cmd = a.operatorVerb(cmd, &o, events.KindRevoke, false, false, func(args []string) events.Payload {
		return &events.Revoke{Module: args[1], Build: args[2], By: o.by}
	})
	var allowMissing bool
	cmd.Flags().BoolVar(&allowMissing, "allow-missing-build", false, "revoke a sha256: build the builds bucket does not hold (an approval of a build removed since); a build of no build's form is refused still")
	publish := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, cancel := o.context(cmd)
		build, err := a.resolveBuildPrefix(ctx, args[2])
		if err == nil {
			args[2] = build // the payload's build: whole
			err = a.checkBuildArg(ctx, args[1], args[2], allowMissing, true)
		}
		cancel()
		if err != nil {
			return err
		}
		return publish(cmd, args)
	}
	return cmd
}

func newWaiveCmd(a *app) *cobra.Command {
	var o operatorFlags
	cmd := &cobra.Command{
		Use:   "waive NODE MODULE PATH --by NAME",
		Short: "Pay a file's owed items without a knock (a path nobody will fill)",
		Long: `waive publishes a waive event: the owed items of MODULE's file PATH on NODE
are paid without a knock, and a refusal of that file judged by a plan that
exists now is owed nothing, whether it arrives before or after the waive. Use
it for a bogus owed item ('meshfold state NODE' lists owed items, 'fleet'
flags those older than an hour). A refusal judged by a later plan is owed
again: it is a new fact. A waive of a file nothing is owed for now is
published (it still covers a refusal judged by a plan that exists now) with
a note on stderr.

A MODULE or PATH that nothing owed names and neither the node's newest
want nor its newest plan declares (a mistyped name) is refused: exit 2,
nothing published, and the message names what the want declares ("did you
mean …?" when one is close). --ahead publishes such a waive anyway, for a
refusal judged by a plan that exists now.

Prints the event's stream sequence; exit 1 if the publish failed, 2 on a
usage error.

` + newNodeHelp,
		Example: `  meshfold waive ace mesh-build-go /run/mesh-build-go/old.creds --by alice
  meshfold waive ace web /run/web/gone.key --by alice --ahead   # a late refusal judged by an older plan`,
		Args:              cobra.ExactArgs(3),
		ValidArgsFunction: a.completeNodes(1),
	}
	return a.operatorVerb(cmd, &o, events.KindWaive, false, false, func(args []string) events.Payload {
		return &events.Waive{Module: args[1], Path: args[2], By: o.by}
	})
}

// context is the command's context bounded by --timeout.
// operatorVerb completes the command of an operator verb: its flags (--by;
// --reason and --all when asked; --new; the connection and the stream) and
// a RunE that publishes one event of kind, made by mk from the arguments,
// to each node named: every argument of a verb that takes --all, else the
// first.
func (a *app) operatorVerb(cmd *cobra.Command, o *operatorFlags, kind events.Kind, reason, all bool, mk func(args []string) events.Payload) *cobra.Command {
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, cancel := o.context(cmd)
		defer cancel()
		nodes := args
		if !all && kind != events.KindRetire {
			// retire takes many nodes as pause and poke do (a fresh
			// user's finding m2: fifty retires took a shell loop), but
			// no --all.
			nodes = args[:1]
		}
		check := checkWant
		if r, ok := mk(args).(*events.Retire); ok && r.Force {
			// A node the stream knows but that never had a want (a
			// provisioner started under a mistyped name) is what
			// --force is for: fleet lists it, and no agent will settle
			// its empty plan (a fresh user's finding U15: it needed
			// --new as well).
			check = checkKnown
		}
		if kind == events.KindPause || kind == events.KindResume {
			// A node the stream knows (an agent, a have) may be paused
			// before its first want, so that the want waits (a fresh
			// user's finding: refused as "mistyped?"); only a name the
			// stream holds nothing of is.
			check = checkKnown
		}
		if o.newNode {
			check = checkNone
		}
		seqs, err := a.publishEachSeqs(ctx, kind, nodes, o.all, check, o.ahead || o.newNode, func() events.Payload { return mk(args) })
		if kind == events.KindPoke && o.wait > 0 && len(seqs) > 0 {
			// After the publishes' own timeout: a wait of its own.
			wctx, wcancel := context.WithTimeout(cmd.Context(), o.wait+5*time.Second)
			defer wcancel()
			a.awaitKnockAnswers(wctx, seqs, o.wait)
		}
		return err
	}
	o.add(a, cmd, reason, all)
	if kind == events.KindPoke {
		cmd.Flags().DurationVar(&o.wait, "wait", 5*time.Second, "how long to wait for each node's provisioner to take the knock the poke brings (0: do not wait)")
	}
	o.addNew(cmd, kind == events.KindPause || kind == events.KindResume)
	switch kind {
	case events.KindWaive:
		cmd.Flags().BoolVar(&o.ahead, "ahead", false, aheadFlagHelp("waive"))
	case events.KindRevoke:
		cmd.Flags().BoolVar(&o.ahead, "ahead", false, aheadFlagHelp("revoke"))
	}
	a.conn.add(cmd)
	a.stream.add(cmd)
	return publishes(cmd, kind)
}

func (o *operatorFlags) context(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), o.timeout)
}

// publishEach publishes one event of kind, made by mk, to each of nodes
// (or, with all, to every node that has a want and is not retired or
// retiring: those are skipped, and said so on stderr), and reports each on
// its own line. Everything is checked before anything is published: a bad
// node name, no node, --all beside nodes, or a payload that fails
// validation are usage errors (exit 2); so is a named node check refuses
// (checkWant: the stream holds no want of it; checkKnown: no event). A
// retired node named to a verb that takes --all is refused (exit 1:
// refuseRetired). A
// publish that fails is reported and the others still go; the error then
// says how many failed (exit 1).
func (a *app) publishEach(ctx context.Context, kind events.Kind, nodes []string, all bool, check nodeCheck, ahead bool, mk func() events.Payload) error {
	_, err := a.publishEachSeqs(ctx, kind, nodes, all, check, ahead, mk)
	return err
}

// publishEachSeqs is publishEach, returning the stream sequence of each
// event published, by node.
func (a *app) publishEachSeqs(ctx context.Context, kind events.Kind, nodes []string, all bool, check nodeCheck, ahead bool, mk func() events.Payload) (map[string]uint64, error) {
	switch {
	case all && len(nodes) > 0:
		return nil, withCode(exitUsage, fmt.Errorf("--all names every node: name no node beside it (got %s)", strings.Join(nodes, " ")))
	case !all && len(nodes) == 0:
		return nil, withCode(exitUsage, errors.New("name at least one NODE, or --all"))
	}
	for _, n := range nodes {
		if !events.ValidName(n) {
			return nil, withCode(exitUsage, &events.FieldError{Field: "NODE", Value: n, Err: events.ErrBadName})
		}
	}
	if err := events.Stamp(mk(), time.Now()).Validate(); err != nil {
		return nil, withCode(exitUsage, err)
	}
	nc, js, pub, err := a.openPublisher(ctx)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	// A named operator's creds publish on its named subjects, the only
	// ones the server lets them (store.Publisher.As), which a stream
	// stores once an administrator asked (auth enable-named): before,
	// the publish would find no stream.
	if named := a.namedOperator(); named != "" {
		stream, scfg, err := a.stream.openStream(ctx, js)
		if err != nil {
			return nil, err
		}
		if !store.CapturesNamed(stream, scfg) {
			return nil, fmt.Errorf("nothing published: these creds are operator %s's, and the stream %s does not store named operators' events yet: "+
				"an administrator runs meshfold auth enable-named --dir DIR once every reconciler is upgraded (docs/operations.md, \"Named operators\")", named, scfg.Name)
		}
		pub = pub.As(named)
	}
	if all {
		if nodes, err = a.wantedNodes(ctx, js); err != nil {
			return nil, err
		}
		if len(nodes) == 0 {
			return nil, errors.New("--all: no node has a want yet")
		}
		had := len(nodes)
		if nodes, err = a.dropRetired(ctx, js, kind, nodes); err != nil {
			return nil, err
		}
		if len(nodes) == 0 {
			return nil, fmt.Errorf("--all: every node with a want (%d) is retired or retiring: nothing published", had)
		}
		if ap, ok := mk().(*events.Approve); ok && !ahead {
			if nodes, err = a.dropNotWanting(ctx, js, nodes, ap.Module); err != nil {
				return nil, err
			}
		}
	} else {
		switch check {
		case checkWant:
			if err := a.checkWanted(ctx, nc, js, kind, nodes); err != nil {
				return nil, err
			}
		case checkKnown:
			if err := a.checkKnown(ctx, nc, kind, nodes); err != nil {
				return nil, err
			}
		}
		if err := a.refuseRetired(ctx, js, kind, nodes); err != nil {
			return nil, err
		}
	}
	if !ahead {
		// A module or path the newest want does not declare is refused,
		// before anything is published (a fresh user's findings U4,
		// U17: a typo was published with a note, exit 0).
		var err error
		switch p := mk().(type) {
		case *events.Approve:
			err = a.refuseUndeclared(ctx, nc, js, kind, nodes, all, p.Module, "")
		case *events.Revoke:
			// As approve: a mistyped module would leave the approval
			// in force while the revoke is stored (exit 0).
			err = a.refuseUndeclared(ctx, nc, js, kind, nodes, all, p.Module, "")
		case *events.Waive:
			err = a.refuseUndeclared(ctx, nc, js, kind, nodes, all, p.Module, p.Path)
		}
		if err != nil {
			return nil, err
		}
	}
	var ignored error // the named nodes the fold would ignore the verb for
	if kind == events.KindResume || kind == events.KindPause {
		// A resume of a node not paused, or a pause of one paused
		// already, changes nothing (the fold's rule): publish nothing
		// for it and say so, and exit 1 as the rollout verbs do for a
		// verb the rollout would ignore (a fresh user's findings: a
		// resume of nothing was published; then U17: a second pause was
		// published, and a resume of nothing exited 0).
		named := len(nodes)
		if nodes, err = a.dropIgnored(ctx, js, kind, nodes, all); err != nil {
			return nil, err
		}
		switch {
		case all && len(nodes) == 0:
			return nil, fmt.Errorf("--all: %s", map[events.Kind]string{
				events.KindPause:  "every node is paused already: nothing published",
				events.KindResume: "no node is paused: nothing published"}[kind])
		case !all && named == 1 && len(nodes) == 0:
			what := map[events.Kind]string{events.KindPause: "paused already", events.KindResume: "not paused"}[kind]
			ignored = fmt.Errorf("nothing published: the reconciler ignores a %s of a node %s", kind, what)
		case !all && len(nodes) < named:
			what := map[events.Kind]string{events.KindPause: "paused already", events.KindResume: "not paused"}[kind]
			ignored = fmt.Errorf("%d of %d %s %s: nothing published to %s", named-len(nodes), named,
				map[bool]string{true: "node", false: "nodes"}[named == 1], what,
				map[bool]string{true: "it", false: "them"}[named-len(nodes) == 1])
		}
		if len(nodes) == 0 {
			return nil, ignored
		}
	}
	var notes map[string]string
	switch p := mk().(type) {
	case *events.Waive:
		notes = a.waiveNotes(ctx, nc, nodes, p)
	case *events.Revoke:
		notes = a.revokeNotes(ctx, nc, nodes, p)
	case *events.Gate:
		notes = a.gateNotes(ctx, nc, nodes, p)
	case *events.Retire:
		if !p.Force {
			notes = a.retireNotes(ctx, js, nodes)
		}
		if notes == nil {
			notes = map[string]string{} // --force asks no agent: a fleet's note alone (a fresh user's finding: a nil map's panic)
		}
		for n, note := range a.retireFleetNotes(ctx, js, nodes) {
			if notes[n] != "" {
				note = notes[n] + "\nnote: " + note
			}
			notes[n] = note
		}
	}
	failed := 0
	seqs := make(map[string]uint64, len(nodes))
	for _, n := range nodes {
		p := events.Stamp(mk(), time.Now())
		ack, err := pub.AppendRetrying(ctx, n, p)
		if err != nil {
			if errors.Is(err, nats.ErrPermissionViolation) || errors.Is(context.Cause(ctx), nats.ErrPermissionViolation) {
				// run explains it once (explainDenied); every other node
				// would be denied too. A read before the publish that was
				// denied cancels ctx (watchDenied): the publish then fails
				// "context canceled", no failure of its own to print (a
				// fresh user's finding V4: retire printed "not published:
				// context canceled" above the refusal).
				return nil, err
			}
			failed++
			fmt.Fprintf(a.stderr, "%s %s: not published: %v\n", kind, n, err)
			continue
		}
		fmt.Fprintf(a.stdout, "%s %s: stream sequence %d\n", kind, n, ack.Seq)
		seqs[n] = ack.Seq
		if ak, ok := p.(*events.Ack); ok {
			// The fold's rule (reconcile.State.Ack): no upto, or one above
			// the ack itself, is the ack's own sequence.
			upto := ak.Upto
			if upto == 0 || upto > ack.Seq {
				upto = ack.Seq
			}
			fmt.Fprintf(a.stderr, "note: %s's journal warnings stored through #%d are acknowledged: 'meshfold fleet' counts them apart, not as a need\n", n, upto)
		}
		if note := notes[n]; note != "" {
			fmt.Fprintln(a.stderr, "note:", note)
		}
		if ap, ok := p.(*events.Approve); ok {
			// An approval may come before the want that needs it
			// (DESIGN.md §4), so it is stored either way; a typo in the
			// node or module is worth a word on stderr.
			if note := a.approvalNote(ctx, js, n, ap.Module, ap.Build); note != "" {
				fmt.Fprintln(a.stderr, "note:", note)
			}
		}
	}
	if failed > 0 {
		return seqs, errors.Join(fmt.Errorf("%d of %d %s events not published", failed, len(nodes), kind), ignored)
	}
	return seqs, ignored
}

// dropIgnored returns the nodes the fold would not ignore kind for: for
// a resume those paused now, for a pause those not paused (feed.Paused:
// the stream's newest pause newer than its newest resume and retire). It
// says of the others that nothing is published: each on its own stdout
// line when named, in one stderr note under --all.
func (a *app) dropIgnored(ctx context.Context, js jetstream.JetStream, kind events.Kind, nodes []string, all bool) ([]string, error) {
	stream, cfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return nil, err
	}
	var kept, not []string
	for _, n := range nodes {
		p, seq, err := feed.Paused(ctx, stream, cfg.Subjects(), n)
		if err != nil {
			return nil, fmt.Errorf("node %s: read its pause: %w", n, err)
		}
		if (p != nil) == (kind == events.KindResume) {
			kept = append(kept, n)
			continue
		}
		not = append(not, n)
		if all {
			continue
		}
		if kind == events.KindResume {
			fmt.Fprintf(a.stdout, "resume %s: not paused: nothing published\n", n)
		} else {
			fmt.Fprintf(a.stdout, "pause %s: paused already (pause #%d by %s): nothing published\n", n, seq, events.Text(p.By))
		}
	}
	if all && len(not) > 0 {
		names := not
		if len(names) > 5 {
			names = append(slices.Clone(names[:5]), "…")
		}
		what := map[events.Kind]string{events.KindPause: "paused already", events.KindResume: "not paused"}[kind]
		fmt.Fprintf(a.stderr, "note: --all skipped %s %s (%s): nothing published to them\n", plural(len(not), "node"), what, strings.Join(names, ", "))
	}
	return kept, nil
}

// dropNotWanting returns the nodes whose newest want names module: what
// 'approve --all' approves on. An approval on a node whose want does not
// name the module would let a later placement there (a relabel, a new
// fleet group) run it with no approval anyone looked at (a fresh user's
// finding M4). It says on stderr how many it skipped, and how to approve
// ahead deliberately. With none left it returns nodes: refuseUndeclared
// then refuses the whole (exit 2, nothing published).
func (a *app) dropNotWanting(ctx context.Context, js jetstream.JetStream, nodes []string, module string) ([]string, error) {
	var kept, skipped []string
	for _, n := range nodes {
		d, err := a.newestWant(ctx, js, n)
		if err != nil {
			return nil, err
		}
		if d.undeclared(module, "") == "" {
			kept = append(kept, n)
		} else {
			skipped = append(skipped, n)
		}
	}
	if len(kept) == 0 {
		return nodes, nil // refuseUndeclared refuses it, naming the modules the wants name
	}
	if len(skipped) > 0 {
		names := skipped
		if len(names) > 5 {
			names = append(slices.Clone(names[:5]), "…")
		}
		fmt.Fprintf(a.stderr, "note: --all approves on the %s whose newest want names %s; it skipped %s whose want does not (%s): "+
			"an approval there would let a later placement run %s unseen; to approve ahead there, name them and give --ahead\n",
			plural(len(kept), "node"), events.Short(module), plural(len(skipped), "node"), strings.Join(names, ", "), events.Short(module))
	}
	return kept, nil
}

// nodeCheck is what publishEach checks of each node named before it
// publishes (issue 25: no node from a typo).
type nodeCheck int

const (
	checkNone  nodeCheck = iota // --new: publish to any valid name
	checkWant                   // the stream holds a want of the node
	checkKnown                  // the stream holds some event of the node
)

// checkKnown refuses (exit 2) when the stream holds no event of one of
// nodes (query.Reader.Count) and the reconciler's state does not hold it
// either (stateKnows: its events aged out): a mistyped name would make a
// phantom node.
func (a *app) checkKnown(ctx context.Context, nc *nats.Conn, kind events.Kind, nodes []string) error {
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return err
	}
	for _, n := range nodes {
		c, err := r.Count(ctx, n)
		if err != nil {
			return fmt.Errorf("node %s: count its events: %w", n, err)
		}
		if c == 0 {
			if _, ok := a.stateKnows(ctx, r, n); ok {
				continue // its events aged out (--max-age)
			}
			cfg, _ := r.Stream(ctx)
			how := fmt.Sprintf("--new %s it anyway", kind)
			if kind == events.KindApprove {
				how = "to approve ahead of a new node's first want and first connection, give --new"
			}
			return withCode(exitUsage, fmt.Errorf("node %s has no event in stream %s: nothing published (is the name mistyped? 'meshfold fleet' lists the nodes; %s)", n, cfg.Name, how))
		}
	}
	return nil
}

// checkWanted refuses (exit 2) when the stream holds no want of one of
// nodes and the reconciler's state holds none either (stateKnows: it aged
// out): a mistyped name would make a phantom node.
func (a *app) checkWanted(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, kind events.Kind, nodes []string) error {
	stream, cfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return err
	}
	var r *query.Reader
	for _, n := range nodes {
		_, err := store.LastMsg(ctx, stream, cfg.Subjects(), n, events.KindWant)
		if errors.Is(err, store.ErrNoMessage) {
			// Its want may have aged out (--max-age) while the
			// reconciler's state holds it.
			if r == nil {
				if r, err = a.stream.reader(nc, query.Config{}); err != nil {
					return err
				}
			}
			if v, ok := a.stateKnows(ctx, r, n); ok && v.Want != 0 {
				continue
			}
			if kind == events.KindRetire {
				if kinds := nodeKinds(ctx, stream, cfg.Subjects(), n); len(kinds) > 0 {
					// A phantom (a provisioner or agent started under a
					// mistyped name): fleet lists it, and only --force
					// retires a node no agent settles (finding U15).
					return withCode(exitUsage, fmt.Errorf("node %s has events in stream %s (%s) but never a want: nothing published; "+
						"a provisioner or agent started under a mistyped name leaves such a node, and no agent settles its empty plan: "+
						"'meshfold retire %s --force --by NAME' retires it at once", n, cfg.Name, strings.Join(kinds, ", "), n))
				}
			}
			return withCode(exitUsage, fmt.Errorf("node %s has no want in stream %s: nothing published (is the name mistyped? 'meshfold fleet' lists the nodes; --new %s it anyway)", n, cfg.Name, kind))
		}
		if err != nil {
			return fmt.Errorf("node %s: read its want: %w", n, err)
		}
	}
	return nil
}

// nodeKinds names the kinds of node's events the stream holds, with how
// many of each ("3 prov"); nil when it holds none or cannot say.
func nodeKinds(ctx context.Context, stream jetstream.Stream, subj events.Subjects, node string) []string {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj.StoredNode(node)))
	if err != nil {
		return nil
	}
	var out []string
	for sub, c := range info.State.Subjects {
		out = append(out, fmt.Sprintf("%d %s", c, sub[strings.LastIndexByte(sub, '.')+1:]))
	}
	slices.Sort(out)
	return out
}

// waiveNotes says, per node, when nothing is owed for w's module and path
// in the node's state (query.Reader.State) before the waive: the waive
// pays nothing now. A node whose state cannot be read gets no note.
func (a *app) waiveNotes(ctx context.Context, nc *nats.Conn, nodes []string, w *events.Waive) map[string]string {
	return a.stateNotes(ctx, nc, nodes, func(n string, ns query.NodeState) string {
		if slices.ContainsFunc(ns.View.Owed, func(o events.Owed) bool { return o.Module == w.Module && o.Path == w.Path }) {
			return ""
		}
		note := fmt.Sprintf("nothing is owed for %s's %s on %s ('meshfold state %s' lists owed items): the waive pays nothing now, and covers a refusal of that file judged by a plan that exists now",
			events.Short(w.Module), events.Short(w.Path), n, n)
		c := ns.Composition
		i := slices.IndexFunc(c.Modules, func(m events.PlanModule) bool { return m.Name == w.Module })
		switch {
		case i < 0:
			note += fmt.Sprintf("; %s's newest plan (#%d) has no module %s (mistyped?)", n, c.Plan, events.Short(w.Module))
		case !slices.ContainsFunc(c.Modules[i].Files, func(f events.File) bool { return f.Path == w.Path }):
			note += fmt.Sprintf("; %s's newest plan (#%d) declares no file %s for %s (mistyped?)", n, c.Plan, events.Short(w.Path), events.Short(w.Module))
		}
		return note
	})
}

// revokeNotes says, per node, when neither the node's newest plan nor its
// pending approvals (query.Reader.State) name r's module: the revoke takes
// back nothing the node runs or waits for (a mistyped module, most often).
// A node whose state cannot be read gets no note.
func (a *app) revokeNotes(ctx context.Context, nc *nats.Conn, nodes []string, r *events.Revoke) map[string]string {
	return a.stateNotes(ctx, nc, nodes, func(n string, ns query.NodeState) string {
		if slices.ContainsFunc(ns.Composition.Modules, func(m events.PlanModule) bool { return m.Name == r.Module }) {
			return ""
		}
		return fmt.Sprintf("%s's newest plan (#%d) has no module %s (mistyped? 'meshfold state %s' lists its modules): the revoke is stored, and takes back an approval only if one was given",
			n, ns.Composition.Plan, events.Short(r.Module), n)
	})
}

// stateNotes returns, per node, what note says of the node's state
// before an operator event (query.Reader.State); a node whose state
// cannot be read, or of which note says "", gets none, and so does every
// node when no reader can be made.
func (a *app) stateNotes(ctx context.Context, nc *nats.Conn, nodes []string, note func(node string, ns query.NodeState) string) map[string]string {
	notes := map[string]string{}
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return notes
	}
	for _, n := range nodes {
		ns, err := r.State(ctx, n)
		if err != nil {
			continue
		}
		if s := note(n, ns); s != "" {
			notes[n] = s
		}
	}
	return notes
}

// wantedNodes returns every node the stream holds a want of.
func (a *app) wantedNodes(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	stream, cfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return nil, err
	}
	return store.ListNodes(ctx, stream, cfg.Subjects(), events.KindWant)
}

// completeNodes is a cobra ValidArgsFunction completing node names from
// the stream (every node it holds an event of), for the first n
// positional arguments (-1: every one). It connects with the command's
// flags, as the verb would, and gives up quietly after two seconds.
func (a *app) completeNodes(n int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if n >= 0 && len(args) >= n {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
		defer cancel()
		nc, js, err := a.connectJS("meshfold-complete")
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer nc.Close()
		stream, cfg, err := a.stream.openStream(ctx, js)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		nodes, err := store.ListNodes(ctx, stream, cfg.Subjects(), "*")
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, node := range nodes {
			if strings.HasPrefix(node, toComplete) && !slices.Contains(args, node) {
				out = append(out, node)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
