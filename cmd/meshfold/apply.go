package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
)

// apply (DESIGN.md §11) starts a rollout from a fleet file.

func init() { register(newApplyCmd) }

func newApplyCmd(a *app) *cobra.Command {
	var (
		file, by, reason string
		dryRun           bool
		allowEmpty       bool
		o                applyChecks
		timeout, wait    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "apply -f FLEET.yaml --by NAME [--dry-run] [--reason TEXT]",
		Short: "Start a rollout of a fleet file: each owned node's want, in batches",
		Long: `apply reads a fleet file (the nodes a fleet owns with their labels, groups of
modules selected by label, and the rollout block), computes each owned node's
want, and starts a rollout over the nodes whose want differs from their newest
want, or that are retired (the targets: a want brings a retired node back, so
applying its fleet again gives it its want again). The rollout controller,
which 'meshfold serve' and 'meshfold reconcile' run, then gives the targets
their new wants in batches, within max_unavailable, waiting for a promote
after a canary, halting on a failure and, with auto_revert, giving every
changed target its previous want back. A new apply supersedes a rollout of
the fleet still in progress.

--dry-run prints each target's want difference and the batches, and publishes
nothing; it refuses what apply would refuse, with the same exit code. Errors
in the file are said as FILE:LINE:COLUMN: error: FIELD: what (a syntax error
where it begins, and what was expected). A group whose selector matches no
owned node is an error too (a typo, role: wbe, would give every node a want
without the group's modules, so the rollout would remove them fleet-wide);
--allow-empty-group makes it a warning, for a group kept on purpose before its
nodes are labelled. A canary that holds every target is a warning (canary: 9
of 4 targets: every target is a canary, and the promote only ends it), and so
are nodes already unavailable (agents down, paused, unhealthy) that spend
max_unavailable before the first step (nothing moves until one is back: the
text is the stalled line of 'rollout status'), and a target whose new want has
no module (it runs nothing once its step is done; 'rollout status' says "done,
runs nothing now"), and a want that declares files but has no provisioner
module (the node accepts no write of them: nothing fills them, and the
rollout fails at healthy_deadline), and targets whose new want gives a
module requires_approval at a build new to them (each waits for an
operator's approval, spending max_unavailable: 'meshfold approve NODE...
MODULE BUILD --by NAME --ahead' gives it before their turn); apply and
--dry-run both print them.

apply and --dry-run refuse, publishing nothing:
  - nodes the newest rollout of another fleet names, whether or not their
    wants differ (a node is owned by one fleet: a copied fleet file would
    roll its builds over the other fleet's nodes), naming each and its
    fleet (exit 3); --take-over moves them to this fleet with the rollout
    that gives them its wants (none starts when no want changes);
  - a build of no build's form ("garbage": neither sha256:<64 hex>, what
    'meshfold build push' prints, nor another runtime's <scheme>:<id>; a
    slip of the sha256 scheme, "sh256:…", is none either), as
    'meshfold want' does (exit 2, whatever the flags), naming the module,
    the build and the stored builds nearest to it;
  - a sha256: build the builds bucket does not hold, as 'meshfold want'
    does (exit 1), naming the nearest stored; --allow-missing-build starts
    it anyway;
  - nodes that have no event in the stream (a mistyped name would make a
    phantom node; exit 2); --new rolls out to them anyway (a fleet's first
    nodes, before their agents start).

--timeout (30 s) bounds the whole apply: its reads of every owned node's
newest events (eight nodes at a time) and of the fleets' rollouts, then the
publish. One that runs out before the publish says the step and the node it
was reading, and that nothing was published: run it again, with a longer
--timeout on a loaded cluster.

Once the rollout is started, apply waits for a rollout controller to record it
(--wait, 2 s by default; a live controller records it "running" within
milliseconds, and apply returns then, saying nothing more). When none does, a
note on stderr says that nothing steps the rollout until a controller runs,
and what to check ('meshfold rollout status FLEET' says "unattended" only
once a step has waited 30 s). The exit code is 0 either way: the start is
stored, and a controller started later takes it.

Follow it with 'meshfold rollout status FLEET'. Exit 1 if the publish failed,
2 on a usage error or an invalid file. A build a rollout has given out stays
needed: 'meshfold build rm' refuses it while a want, a have or the rollout's
revert names it.

` + byUncheckedHelp,
		Example: `  meshfold apply -f fleet.yaml --by alice --dry-run   # refuses what apply would (a build "garbage": exit 2)
  meshfold apply -f fleet.yaml --by alice --reason "web 1.4"
  # in a script that checks the controller otherwise: do not wait for its record
  meshfold apply -f fleet.yaml --by alice --wait 0
  # a group whose nodes are not labelled yet, on purpose
  meshfold apply -f fleet.yaml --by alice --allow-empty-group
  meshfold rollout status web
  # move nodes fleet web's rollout names to fleet api, on purpose
  meshfold apply -f api.yaml --by alice --take-over --reason "ace moves to api"`,
		Args: noArgs(""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dryRun && !cmd.Flags().Changed("by") && a.namedOperator() == "" {
				by = "dry-run"
			} else if err := a.settleByFor(cmd, &by, rolloutUnchecked); err != nil {
				return err
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return withCode(exitUsage, err)
			}
			fleet, warnings, err := fleetfile.ParseWith(data, fleetfile.Options{AllowEmptyGroup: allowEmpty})
			for _, w := range warnings {
				fmt.Fprintln(a.stderr, w.In(file))
			}
			if problems := (fleetfile.Errors)(nil); errors.As(err, &problems) {
				return withCode(exitUsage, fleetFileError{file, problems})
			}
			if err != nil {
				return withCode(exitUsage, fmt.Errorf("%s: %w", file, err))
			}
			if dryRun {
				// A dry run publishes nothing: a read refused is
				// explained as the read it is (operator-read may).
				delete(cmd.Annotations, publishesRolloutAnnotation)
			} else {
				cmd.Annotations[rolloutFleetAnnotation] = fleet.Name
			}
			started := time.Now()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			// Every read before the publish says, when it fails, which
			// step it was and that nothing was published (a fresh user's
			// finding G0: "last message on 0.mesh.n03.want: context
			// deadline exceeded", and no more).
			before := func(step string, err error) error {
				return applyGaveUp(err, step, len(fleet.Nodes), timeout, time.Since(started))
			}
			nc, js, _, err := a.openPublisher(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			stream, scfg, err := a.stream.openStream(ctx, js)
			if err != nil {
				return err
			}
			r, err := a.stream.reader(nc, query.Config{})
			if err != nil {
				return err
			}
			plan, err := feed.NewPlanHeld(ctx, feed.WithLeaderWants(stream, js), scfg.Subjects(), fleet, by, reason, a.heldWant(r))
			if err != nil {
				return before("reading the fleet's nodes' newest events", err)
			}
			if plan.Start != nil {
				// Over a rollout still going on, which the start
				// supersedes: a revert gives its unfinished targets
				// back the want from before it, not its own.
				prior, err := feed.Active(ctx, js, scfg, fleet.Name)
				if err != nil {
					return before(fmt.Sprintf("reading fleet %s's rollout in progress", fleet.Name), err)
				}
				plan.Over(prior)
			}
			if plan.Start != nil {
				if err := rollout.Stamp(plan.Start, time.Now()).Validate(); err != nil {
					return withCode(exitUsage, err)
				}
			}
			// Another fleet's nodes are refused whether or not their
			// wants differ: the file claims them either way (a fresh
			// user's finding L2: exit 0 when the wants matched, 3 when
			// not).
			owners, err := checkOwners(ctx, stream, scfg, plan, o.takeOver)
			if err != nil {
				return before("reading the other fleets' rollouts", err)
			}
			if plan.Start == nil && len(owners) > 0 {
				stays := "stays"
				if len(owners) > 1 {
					stays = "stay"
				}
				fmt.Fprintf(a.stderr, "note: %s %s fleet %s's: a take-over moves a node with the rollout that gives it this fleet's want, and no want changes\n",
					strings.Join(slices.Sorted(maps.Keys(owners)), ", "), stays, strings.Join(distinct(owners), ", "))
			}
			if plan.Start != nil {
				if err := checkApply(ctx, a, r, stream, scfg, plan, o, dryRun); err != nil {
					return before("checking the builds and the new nodes", err)
				}
				if note := notBundleNote(planModules(plan)); note != "" {
					fmt.Fprintln(a.stderr, note) // as want says it, dry run or not
				}
				if note := plan.UntrustedNote(); note != "" {
					fmt.Fprintln(a.stderr, note) // dry run or not: its targets would fail
				}
			}
			printPlan(a.stdout, plan)
			if dryRun || plan.Start == nil {
				return nil
			}
			id, err := plan.Apply(ctx, js, scfg.Subjects())
			if id == 0 && timedOut(err) {
				return fmt.Errorf("apply gave up after %s, its --timeout (%s), publishing the rollout's start: no acknowledgement came, so it may have been stored all the same: "+
					"'meshfold rollout status %s' says whether a rollout started; run apply again only if none did: %w", roundTook(time.Since(started)), timeout, fleet.Name, err)
			}
			if errors.Is(err, feed.ErrStartedMeanwhile) {
				return withCode(exitConflict, fmt.Errorf("conflict: %w", err))
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "rollout %d of fleet %s started\n", id, fleet.Name)
			if !o.allowMissing {
				// A build removed between the check and the start (a
				// 'meshfold build rm' beside it): said (want.go,
				// removedMeanwhile).
				w := &events.Want{}
				for _, c := range plan.Cands {
					w.Modules = append(w.Modules, c.Want...)
				}
				if err := removedMeanwhile(ctx, r, w); err != nil {
					return err
				}
			}
			// Nothing steps the rollout without a controller, and only
			// 'rollout status', 30 s on, said so (a fresh user's
			// finding m2): a controller records it within
			// milliseconds, else a note says what to check.
			a.awaitController(cmd.Context(), js, r, scfg, fleet.Name, id, wait)
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the fleet file (YAML or JSON)")
	_ = cmd.MarkFlagRequired("file")
	cmd.Flags().StringVar(&by, "by", "", "who applies (required unless --dry-run, but a named operator's creds give their name); kept in the stream for the audit")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit (one line)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print each target's want difference and the batches; publish nothing")
	cmd.Flags().BoolVar(&o.takeOver, "take-over", false, "roll over nodes the newest rollout of another fleet names (refused without it: two fleet files would fight over them)")
	cmd.Flags().BoolVar(&o.allowMissing, "allow-missing-build", false, "start a rollout of sha256: builds the builds bucket does not hold (yet); a build of no build's form is refused still")
	cmd.Flags().BoolVar(&allowEmpty, "allow-empty-group", false, "take a group whose selector matches no owned node (refused without it: a selector typo would remove the group's modules from every node)")
	cmd.Flags().BoolVar(&o.newNodes, "new", false, "roll out to nodes that have no event in the stream yet (refused without it: a mistyped name would make a phantom node)")
	cmd.Flags().DurationVar(&wait, "wait", DefaultControllerWait, "how long to wait for a rollout controller to record the rollout started, to say when none did (0: do not wait); as long again when a live controller holds the fleet's lease")
	addPublishTimeout(cmd, &timeout)
	a.conn.add(cmd)
	a.stream.add(cmd)
	return publishesRollout(cmd, string(rollout.KindStart))
}

// heldWant asks the reconciler's state (else its snapshot, else a fold
// of the stream: query.Reader.Fold) for the newest want of a node whose
// want subject holds none (feed.HeldWant): with --max-age, a node whose
// want aged out is no new node, and a revert must give that want back,
// never an empty one (a fresh user's finding F0). A node nothing knows
// had none. A state that cannot be read refuses the apply: what a
// revert would give back would be unknown.
//
// Credentials that may not ask the fold endpoint (operator-read, whose
// dry run this is) read the snapshot instead (query.Reader.Stored): the
// refusal ends that ask, not the verb (askRefused).
func (a *app) heldWant(r *query.Reader) feed.HeldWant {
	return func(ctx context.Context, node string) (uint64, []events.WantModule, error) {
		st, err := a.foldOrStored(ctx, r, node)
		switch {
		case errors.Is(err, query.ErrUnknownNode):
			return 0, nil, nil
		case err != nil && ctx.Err() != nil:
			// apply's --timeout ran out: said as such (applyGaveUp), not
			// as a want that aged out (a fresh user's finding, fresh13 G2).
			return 0, nil, fmt.Errorf("asking the reconciler for a want of it older than the stream holds: %w", err)
		case err != nil:
			return 0, nil, fmt.Errorf("refused: its want subject holds no want (aged out of the stream? --max-age), and the reconciler's state could not be read for the want it had: %w; "+
				"a revert could not give that want back; nothing was published", err)
		case st.Want == nil:
			return 0, nil, nil
		}
		return st.Want.Seq, st.Want.Modules, nil
	}
}

// printPlan prints each target's want difference and the batches.
func printPlan(w io.Writer, p *feed.Plan) {
	if p.Start == nil {
		fmt.Fprintf(w, "fleet %s: %s, no want changes: nothing to roll out\n", p.Fleet.Name, plural(len(p.Cands), "node"))
		return
	}
	var targets []rollout.Candidate
	for _, c := range p.Cands {
		if c.Target() {
			targets = append(targets, c)
		}
	}
	r := p.Start.Params.Resolve(len(targets), len(p.Cands))
	fmt.Fprintf(w, "fleet %s: %s of %s; canary %d, batch %d, max_unavailable %d, min_healthy %s, healthy_deadline %s, auto_revert %v\n",
		p.Fleet.Name, plural(len(targets), "target"), plural(len(p.Cands), "node"), r.Canary, r.Batch, r.MaxUnavailable, r.MinHealthy, r.HealthyDeadline, r.AutoRevert)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BATCH\tNODE\tCHANGE")
	batch, in := 1, 0
	size := r.Batch
	if r.Canary > 0 {
		size = r.Canary
	}
	var stalled []string // canaries that cannot pass as they are
	for _, c := range targets {
		if in == size {
			batch, in, size = batch+1, 0, r.Batch
		}
		in++
		label := fmt.Sprint(batch)
		if r.Canary > 0 && batch == 1 {
			label = "canary"
		}
		change := feed.Diff(c.Current, c.Want)
		switch {
		case c.New():
			change = "new want: " + feed.Diff(nil, c.Want)
		case c.Retired && rollout.EqualWant(c.Want, c.Current):
			change = "retired: its want published again brings it back"
		case c.Retired:
			change = "retired, brought back: " + change
		}
		// A target that cannot become healthy as it is (a fresh user's
		// finding 4): a paused node takes no new plan, a node whose agent
		// is down applies nothing.
		var why []string
		if c.PausedBy != "" {
			why = append(why, "paused by "+events.Text(c.PausedBy))
		}
		if c.Down {
			why = append(why, "agent down")
		}
		if len(why) > 0 {
			change = strings.Join(why, ", ") + ": " + change
			if label == "canary" {
				stalled = append(stalled, c.Node+" ("+strings.Join(why, ", ")+")")
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", label, c.Node, change)
	}
	_ = tw.Flush()
	// Targets whose want aged out of the stream: diffed against the want
	// the reconciler's state holds, which the start carries for a revert
	// (a fresh user's finding F0).
	var aged []string
	for _, c := range targets {
		if c.Prev == 0 && c.HadSeq != 0 {
			aged = append(aged, fmt.Sprintf("%s (#%d)", c.Node, c.HadSeq))
		}
	}
	if len(aged) > 0 {
		fmt.Fprintf(w, "-- %s: the want the stream no longer holds (--max-age) is read from the reconciler's state: the change is against it, and a revert gives it back\n",
			strings.Join(aged, ", "))
	}
	if len(stalled) > 0 {
		then := "it halts at healthy_deadline"
		if r.AutoRevert {
			then = "it is reverted at healthy_deadline (auto_revert)"
		}
		fmt.Fprintf(w, "-- warning: canary %s cannot become healthy as it is: the rollout waits for it, and %s; resume the node or start its agent first\n",
			strings.Join(stalled, ", "), then)
	}
	// A target left with no module runs nothing once done, which the
	// canary's health cannot tell from a good change (a fresh user's
	// finding U13): said here, and by 'rollout status' ("runs nothing
	// now").
	var empty []string
	for _, c := range targets {
		if len(c.Want) == 0 && len(c.Current) > 0 {
			empty = append(empty, c.Node)
		}
	}
	if len(empty) > 0 {
		fmt.Fprintf(w, "-- warning: %s: the new want has no module (no group that selects the node gives one): every module it runs now is removed, and it runs nothing\n",
			strings.Join(empty, ", "))
	}
	// Files no write can fill, the want having no provisioner module
	// (reconcile.Unfillable; a fresh user's finding U25: the rollout
	// found out at healthy_deadline), said once for the targets that
	// share it.
	var texts []string
	unfillable := map[string][]string{}
	for _, c := range targets {
		for _, u := range reconcile.Unfillable(c.Want) {
			if unfillable[u] == nil {
				texts = append(texts, u)
			}
			unfillable[u] = append(unfillable[u], c.Node)
		}
	}
	for _, u := range texts {
		fmt.Fprintf(w, "-- warning: %s: %s\n", strings.Join(unfillable[u], ", "), u)
	}
	// Modules that wait for an operator's approval: each such target
	// stays waiting-approval, spending max_unavailable, until one is
	// given, and enough of them stall the rollout (a fresh user's
	// finding M3 of fresh10: 20 of them held 100 more targets back).
	for _, g := range approvalWaits(targets) {
		nodes := g.nodes
		if len(nodes) > 5 {
			nodes = append(nodes[:5:5], fmt.Sprintf("… (%d targets)", len(g.nodes)))
		}
		fmt.Fprintf(w, "-- warning: %s: %s requires_approval at %s: each waits for an approval (waiting-approval, spending max_unavailable) unless one is given already; "+
			"approve ahead with 'meshfold approve NODE... %s %s --by NAME --ahead'\n",
			strings.Join(nodes, ", "), g.module, shortBuild(g.build), g.module, approveArg(g.build))
	}
	// Nodes already unavailable that spend max_unavailable before the
	// first step: nothing moves, the canary included (a fresh user's
	// finding U20); said as 'rollout status' says it once started.
	if st := rollout.Stalled(p.Fleet.Name, p.Start, p.Pages, time.Now()); st != "" {
		fmt.Fprintf(w, "-- warning: the budget is spent before the rollout starts: %s\n", st)
	}
	if all := p.Start.Params.CanaryCoversAll(len(targets)); all != "" {
		fmt.Fprintf(w, "-- warning: %s\n", all)
	}
	if users := newRunsAs(targets); len(users) > 0 {
		fmt.Fprintf(w, "-- runs_as %s: checked by each node when it applies, not here (a node knows its users); "+
			"a user a node lacks fails its apply, which halts the rollout ('meshfold rollout why %s NODE' says why)\n",
			strings.Join(users, ", "), p.Fleet.Name)
	}
}

// approvalWait is a module at a build that targets' new wants require
// an approval of, and those targets.
type approvalWait struct {
	module, build string
	nodes         []string
}

// approvalWaits returns, in the targets' order, each module and build a
// target's new want gives it with requires_approval where its current
// want does not name that module at that build: the plan holds such a
// module for an operator's yes, and the target waits for it. An approval
// given already is not read here (the warning says so).
func approvalWaits(targets []rollout.Candidate) []*approvalWait {
	var out []*approvalWait
	for _, c := range targets {
		for _, m := range c.Want {
			if !m.RequiresApproval || slices.ContainsFunc(c.Current, func(x events.WantModule) bool { return x.Name == m.Name && x.Build == m.Build }) {
				continue
			}
			i := slices.IndexFunc(out, func(g *approvalWait) bool { return g.module == m.Name && g.build == m.Build })
			if i < 0 {
				out = append(out, &approvalWait{module: m.Name, build: m.Build})
				i = len(out) - 1
			}
			out[i].nodes = append(out[i].nodes, c.Node)
		}
	}
	return out
}

// approveArg is build as 'meshfold approve' takes it on a command line:
// a sha256 build as its short form (sha256: and 12 hex digits, which
// approve resolves to the one stored build it begins), another whole.
func approveArg(build string) string {
	if h, ok := strings.CutPrefix(build, "sha256:"); ok && len(h) > 12 {
		return "sha256:" + h[:12]
	}
	return events.Text(build)
}

// newRunsAs returns the runs_as accounts the targets' wants give a module
// that is new to its node or whose runs_as changes, each once: the users
// the nodes will look up when they apply, which no dry run can check.
func newRunsAs(targets []rollout.Candidate) []string {
	var users []string
	for _, c := range targets {
		for _, m := range c.Want {
			i := slices.IndexFunc(c.Current, func(x events.WantModule) bool { return x.Name == m.Name })
			if m.RunsAs != "" && (i < 0 || c.Current[i].RunsAs != m.RunsAs) && !slices.Contains(users, m.RunsAs) {
				users = append(users, m.RunsAs)
			}
		}
	}
	return users
}

// planModules returns the modules plan's candidates want, each module
// and build once, in the plan's order, as one want: what checkBuilds and
// notBundleNote read, for apply as for want.
func planModules(plan *feed.Plan) *events.Want {
	w := &events.Want{}
	seen := map[[2]string]bool{}
	for _, c := range plan.Cands {
		for _, m := range c.Want {
			if k := [2]string{m.Name, m.Build}; !seen[k] {
				seen[k] = true
				w.Modules = append(w.Modules, m)
			}
		}
	}
	return w
}

// applyChecks are apply's overrides of its refusals.
type applyChecks struct {
	// takeOver rolls over nodes another fleet's newest rollout names.
	takeOver bool
	// allowMissing starts a rollout of bundle builds the builds bucket lacks.
	allowMissing bool
	// newNodes rolls out to nodes the stream holds no event of.
	newNodes bool
}

// checkOwners refuses plan (exit 3; nothing is published, dry run or
// not) when it names nodes the newest rollout of another fleet names,
// whether or not their wants differ, unless takeOver: then it returns
// those nodes, each with its fleet.
func checkOwners(ctx context.Context, stream jetstream.Stream, scfg store.StreamConfig, plan *feed.Plan, takeOver bool) (map[string]string, error) {
	var nodes []string
	for _, c := range plan.Cands {
		nodes = append(nodes, c.Node)
	}
	owners, err := feed.Owners(ctx, stream, scfg.Subjects(), plan.Fleet.Name, nodes)
	if err != nil {
		return nil, fmt.Errorf("reading the other fleets' rollouts: %w", err)
	}
	if len(owners) == 0 || takeOver {
		return owners, nil
	}
	var b strings.Builder
	for _, n := range nodes {
		if f, ok := owners[n]; ok {
			fmt.Fprintf(&b, "\n  node %s: fleet %s", n, f)
		}
	}
	return nil, withCode(exitConflict, fmt.Errorf("refused: fleet %s names %s the newest rollout of another fleet names; nothing was published:%s\na node is owned by one fleet: drop it from this file (a copied fleet file?), or move it with --take-over",
		plan.Fleet.Name, plural(len(owners), "node"), b.String()))
}

// distinct returns the values of m, each once, sorted.
func distinct(m map[string]string) []string {
	var vs []string
	for _, v := range m {
		if !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	return vs
}

// checkApply refuses plan (nothing is published, dry run or not, and a
// dry run exits as the apply would) when a want names a sha256: build
// the builds bucket lacks (exit 1, unless --allow-missing-build), or
// when a target has no event in the stream (exit 2, unless --new);
// checkOwners refuses another fleet's nodes before it.
func checkApply(ctx context.Context, a *app, r *query.Reader, stream jetstream.Stream, scfg store.StreamConfig, plan *feed.Plan, o applyChecks, dryRun bool) error {
	subj := scfg.Subjects()
	if err := checkBuilds(ctx, r, planModules(plan), o.allowMissing); err != nil {
		return err
	}
	var unknown []string
	for _, c := range plan.Cands {
		if !c.New() {
			continue
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj.StoredNode(c.Node)))
		if err != nil {
			return fmt.Errorf("stream info: %w", err)
		}
		if len(info.State.Subjects) == 0 {
			if _, ok := a.stateKnows(ctx, r, c.Node); ok {
				continue // its events aged out (--max-age)
			}
			unknown = append(unknown, c.Node)
		}
	}
	if len(unknown) == 0 || o.newNodes {
		return nil
	}
	have, typo, them := "have", "mistyped names?", "them"
	if len(unknown) == 1 {
		have, typo, them = "has", "a mistyped name?", "it"
	}
	msg := fmt.Sprintf("%s of fleet %s %s no event in stream %s: %s (%s 'meshfold fleet' lists the nodes; --new rolls out to %s anyway)",
		plural(len(unknown), "node"), plan.Fleet.Name, have, scfg.Name, strings.Join(unknown, ", "), typo, them)
	if dryRun {
		// The dry run answers as the apply would: refused, exit 2.
		return withCode(exitUsage, fmt.Errorf("refused (apply would refuse it too): %s; nothing was published", msg))
	}
	return withCode(exitUsage, fmt.Errorf("refused: %s; nothing was published", msg))
}

// applyGaveUp is apply's error for err, which ended step, a read before
// anything is published: a refusal (a coded error) as it is; one that
// ran out of --timeout (timeout, after took) or found no leader says
// the step and the node it was reading, that nothing was published and
// that a retry with a longer --timeout is safe; any other says the step
// and that nothing was published. nodes is the fleet's node count.
func applyGaveUp(err error, step string, nodes int, timeout, took time.Duration) error {
	var ce *codedError
	if errors.As(err, &ce) {
		return err
	}
	var re *feed.ReadError
	if errors.As(err, &re) {
		step = fmt.Sprintf("reading node %s's %s (one of the %s read before anything is published)", re.Node, re.What, plural(nodes, "node"))
	}
	if re == nil && strings.Contains(err.Error(), "nothing was published") {
		return err // it says so, naming its node (heldWant)
	}
	if timedOut(err) {
		why := "the servers answered too slowly (a loaded cluster?)"
		if errors.Is(err, store.ErrNoLeader) {
			why = err.Error()
		}
		return &quietErr{err: err, msg: fmt.Sprintf("apply gave up after %s, its --timeout (%s), %s: %s; nothing was published, so running it again is safe: give it a longer --timeout (--timeout %s)",
			roundTook(took), timeout, step, why, max(2*timeout, time.Minute))}
	}
	if re != nil {
		return fmt.Errorf("apply: %w; nothing was published", err)
	}
	return fmt.Errorf("apply: %s: %w; nothing was published", step, err)
}

// timedOut reports whether err is a request that ran out of the verb's
// --timeout, or a stream that had no leader within it.
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrNoLeader)
}

// roundTook is took as a message says it: to a tenth of a second, or to
// a millisecond under a second.
func roundTook(took time.Duration) time.Duration {
	if took < time.Second {
		return took.Round(time.Millisecond)
	}
	return took.Round(100 * time.Millisecond)
}

// fleetFileError is a fleet file's errors as a compiler says them,
// file:LINE:COLUMN: error: FIELD: what, one a line, so that an editor
// jumps to each; it unwraps to the fleetfile.Errors.
type fleetFileError struct {
	file string
	errs fleetfile.Errors
}

func (e fleetFileError) Error() string { return e.errs.In(e.file) }
func (e fleetFileError) Unwrap() error { return e.errs }

// foldOrStored asks the reconciler for node's folded state
// (query.Reader.Fold) unless these credentials were refused that ask
// before; a refused ask reads the snapshot instead (query.Reader.Stored).
func (a *app) foldOrStored(ctx context.Context, r *query.Reader, node string) (*reconcile.State, error) {
	var st *reconcile.State
	before, denied, err := a.askState(ctx, func(ctx context.Context) (err error) {
		st, _, err = r.Fold(ctx, node)
		return err
	})
	if before == "" && (denied == "" || ctx.Err() != nil) {
		return st, err
	}
	st, _, err = r.Stored(ctx, node)
	return st, err
}
