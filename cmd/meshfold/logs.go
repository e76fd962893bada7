package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

func init() { register(newLogsCmd) }

type logsOpts struct {
	tail       int
	since      string
	follow     bool
	timestamps bool
	timeout    time.Duration
}

func newLogsCmd(a *app) *cobra.Command {
	var o logsOpts
	cmd := &cobra.Command{
		Use:   "logs NODE MODULE",
		Short: "A module's captured stdout and stderr, from its node agent",
		Long: `logs prints MODULE's stdout and stderr as NODE's agent captured them (the
process runtime keeps them in size-capped rotating files in the agent's
state directory, read across the rotated files and the current one). It
asks the agent's micro service, endpoint logs on
$MESHFOLD.<prefix>.logs.NODE, which only the operator role may use. Log
lines never enter the event stream.

--tail N prints the last N lines (default 100; 0: as much as one page
holds), --since the lines written from a moment on (a duration back from
now, as 10m, or an RFC 3339 time); with both, the later start wins.
--follow then keeps printing new lines until interrupted. --timestamps
prefixes each line with when it was captured and its stream: out
(stdout), err (stderr) or meshfold (the module's supervisor: exits,
restarts, health; an exec check's fall with the check's own output, its
last 512 bytes, left out when it holds a declared file's content).

No agent answering (not running, or no reply within --timeout) exits 1 and
says so. When the stream records the node's agent down, it says since when
and why (as 'meshfold state' does), what the node's newest have said of the
module, and where its output is meanwhile: the module runs on under its
supervisor, which still writes it to <state-dir>/process/MODULE/module.log
on the node (rotated to module-*.log beside it), and only the agent serves
it:

  meshfold: node n10's agent is down since 2026-12-05T08:10:51.204Z (4m ago,
  #812): lease expired, not renewed (agent pid 4242 on vm), and no agent of
  it answered; its newest have (#806, 5m ago) says app running. …

An agent that stops answering while --follow waits for new lines
(restarted, upgraded, killed) is waited for, as tail -F waits for a file,
and said on stderr:

  meshfold: the agent of node ace stopped answering: agent restarting?
  waiting for it (Ctrl-C ends)

The follow goes on where it was when the agent answers again; it ends when
interrupted, or when the node is retired.`,
		Example: `  meshfold logs ace mesh-build-go
  meshfold logs ace mesh-build-go --tail 20 --follow
  meshfold logs ace mesh-build-go --since 1h --tail 1000000 --timestamps`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: a.completeNodes(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runLogs(cmd.Context(), a, args[0], args[1], o)
		},
	}
	fl := cmd.Flags()
	fl.IntVarP(&o.tail, "tail", "n", 100, "how many of the last lines to print (0: one page)")
	fl.StringVar(&o.since, "since", "", "print the lines written since this moment: a duration back from now (10m) or an RFC 3339 time")
	fl.BoolVarP(&o.follow, "follow", "f", false, "keep printing new lines, across restarts of the agent, until interrupted or the node is retired")
	fl.BoolVarP(&o.timestamps, "timestamps", "t", false, "prefix each line with when it was captured and its stream (out, err, meshfold)")
	fl.DurationVar(&o.timeout, "timeout", 5*time.Second, "how long to wait for the node agent to answer")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// followWait is how long one follow request waits for new output.
const followWait = 5 * time.Second

func runLogs(ctx context.Context, a *app, nodeName, module string, o logsOpts) error {
	if !events.ValidName(nodeName) {
		return withCode(exitUsage, &events.FieldError{Field: "NODE", Value: nodeName, Err: events.ErrBadName})
	}
	if !events.ValidName(module) {
		return withCode(exitUsage, &events.FieldError{Field: "MODULE", Value: module, Err: events.ErrBadName})
	}
	if o.tail < 0 {
		return withCode(exitUsage, fmt.Errorf("--tail %d: must not be negative", o.tail))
	}
	since, err := parseSince(o.since, time.Now())
	if err != nil {
		return withCode(exitUsage, err)
	}
	nc, err := a.conn.connect("meshfold-logs", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	subject := node.LogsSubject(a.stream.config().Prefix, nodeName)
	q := node.LogsRequest{Module: module, LogQuery: node.LogQuery{Tail: o.tail, Since: since}}
	answered := false   // the agent answered a request of this command
	var away *agentAway // set while a followed agent does not answer
	for {
		timeout := o.timeout + time.Duration(q.WaitMS)*time.Millisecond
		page, err := requestLogs(ctx, nc, subject, q, timeout)
		if err != nil {
			if ctx.Err() != nil && o.follow {
				return nil // interrupted
			}
			gone := errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded)
			if gone && answered && o.follow {
				// An agent that restarts (an upgrade, a restart) is
				// waited for, as tail -F waits for a file: it ended
				// every operator's follow (a fresh user's finding U24).
				// Only an interrupt or the node's retirement ends it.
				if away == nil {
					away = &agentAway{b: backoff.NewExponentialBackOff(backoff.WithInitialInterval(250*time.Millisecond),
						backoff.WithMaxInterval(2*time.Second), backoff.WithMaxElapsedTime(0))}
					fmt.Fprintf(a.stderr, "meshfold: the agent of node %s stopped answering: agent restarting? waiting for it (Ctrl-C ends)\n", nodeName)
				}
				if done, err := away.wait(ctx, a, nc, nodeName); done || err != nil {
					return err
				}
				continue
			}
			if errors.Is(err, nats.ErrNoResponders) {
				if answered {
					return fmt.Errorf("the agent of node %s stopped answering: it is gone (is 'meshfold node %s' still running?)", nodeName, nodeName)
				}
				if down := a.agentDownErr(ctx, nc, nodeName, module); down != nil {
					return down
				}
				return fmt.Errorf("no agent of node %s answered (is 'meshfold node %s' running?)", nodeName, nodeName)
			}
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				// The request's own deadline: the agent took it and never
				// replied (killed while it waited for new output, say).
				if answered {
					return fmt.Errorf("the agent of node %s stopped answering: no reply within %s (killed or stopped? is 'meshfold node %s' still running?)", nodeName, timeout, nodeName)
				}
				if down := a.agentDownErr(ctx, nc, nodeName, module); down != nil {
					return down
				}
				return fmt.Errorf("no agent of node %s answered within %s (is 'meshfold node %s' running? --timeout waits longer)", nodeName, timeout, nodeName)
			}
			return err
		}
		answered = true
		if away != nil {
			away = nil
			fmt.Fprintf(a.stderr, "meshfold: the agent of node %s answers again; following\n", nodeName)
		}
		for i, l := range page.Lines {
			if o.timestamps {
				var tag node.LogTag
				if i < len(page.Tags) {
					tag = page.Tags[i]
				}
				at := "-"
				if !tag.At.IsZero() {
					at = tag.At.UTC().Format(time.RFC3339Nano)
				}
				fmt.Fprintf(a.stdout, "%s %s %s\n", at, cmp.Or(tag.Stream, "-"), l)
				continue
			}
			fmt.Fprintln(a.stdout, l)
		}
		switch {
		case page.More: // a full page: read on at once
			q.LogQuery = node.LogQuery{Cursor: page.Cursor}
		case o.follow:
			q.LogQuery = node.LogQuery{Cursor: page.Cursor, WaitMS: int(followWait / time.Millisecond)}
		default:
			return nil
		}
	}
}

// logsStateBound bounds agentDownErr's read of the node's state.
const logsStateBound = 3 * time.Second

// agentDownErr is the error of a logs request no agent of node answered
// when the stream records the node's agent down (its view, read once as
// `meshfold state` reads it, within logsStateBound): since when and why,
// what the node's newest have said of module, and where its output is
// while no agent serves it. nil when the agent is not recorded down, or
// the state cannot be read in time: the caller says what it saw. A fresh
// user's finding m5: "no agent of node n10 answered (is 'meshfold node
// n10' running?)" of a node whose agent the stream knew down for
// minutes, its module running on.
func (a *app) agentDownErr(ctx context.Context, nc *nats.Conn, node, module string) error {
	ctx, cancel := context.WithTimeout(ctx, logsStateBound)
	defer cancel()
	r, err := a.stream.reader(nc, query.Config{Timeout: logsStateBound})
	if err != nil {
		return nil
	}
	ns, err := r.State(ctx, node)
	if err != nil || !ns.View.AgentDown() {
		return nil
	}
	return errors.New(agentDownText(node, module, ns.View, time.Now()))
}

// agentDownText says, of node whose agent is down in its view v, why no
// agent answers for module's output, and what to do instead. Ages are
// told against now.
func agentDownText(node, module string, v reconcile.View, now time.Time) string {
	ag := v.Agent
	how := strings.TrimPrefix(audit.AgentSummary(&events.Agent{State: events.AgentDown, Why: ag.Why, Host: ag.Host, PID: ag.PID}), "DOWN: ")
	var b strings.Builder
	fmt.Fprintf(&b, "node %s's agent is down since %s (%s ago, #%d): %s, and no agent of it answered", node, audit.FormatTime(ag.Time), audit.Age(now.Sub(ag.Time)), ag.Seq, how)
	if v.HaveSeq > 0 {
		fmt.Fprintf(&b, "; its newest have (#%d, %s ago) ", v.HaveSeq, audit.Age(now.Sub(v.HaveTime)))
		if i := slices.IndexFunc(v.Runtime, func(m reconcile.ModuleRuntime) bool { return m.Module == module }); i >= 0 {
			fmt.Fprintf(&b, "says %s %s", module, v.Runtime[i].State)
		} else {
			fmt.Fprintf(&b, "names no module %s", module)
		}
	}
	fmt.Fprintf(&b, ". A module runs on under its supervisor while no agent runs, which captures its output still; only the agent serves it: "+
		"start the agent ('meshfold node %s') and ask again, or read the files on the node, <state-dir>/process/%s/module.log and the rotated module-*.log beside it "+
		"(each line as --timestamps prints it; the package's state dir is /var/lib/meshfold/node-%s)", node, module, node)
	return b.String()
}

// agentAway waits for a followed agent that stopped answering.
type agentAway struct {
	b *backoff.ExponentialBackOff
}

// wait waits a while before the next try, and reports done (with what
// it says on stderr) when the node was retired meanwhile: no agent of it
// returns. An interrupt is done too, without a word.
func (w *agentAway) wait(ctx context.Context, a *app, nc *nats.Conn, nodeName string) (bool, error) {
	if js, err := jetstream.New(nc); err == nil {
		if r, err := a.retiredNodes(ctx, js, []string{nodeName}); err == nil && len(r) > 0 {
			fmt.Fprintf(a.stderr, "meshfold: node %s was retired (#%d by %s): no agent of it returns; the follow ends\n", nodeName, r[0].Retire, r[0].By)
			return true, nil
		}
	}
	select {
	case <-ctx.Done():
		return true, nil // interrupted
	case <-time.After(w.b.NextBackOff()):
		return false, nil
	}
}

// parseSince reads --since: empty, a duration back from now, or an RFC
// 3339 time; it returns the RFC 3339 time the query carries.
func parseSince(v string, now time.Time) (string, error) {
	if v == "" {
		return "", nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return "", fmt.Errorf("--since %s: a duration back from now must not be negative", v)
		}
		return now.Add(-d).UTC().Format(time.RFC3339Nano), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return "", fmt.Errorf("--since %q: want a duration (10m) or an RFC 3339 time (2026-01-02T15:04:05Z)", v)
	}
	return t.UTC().Format(time.RFC3339Nano), nil
}

func requestLogs(ctx context.Context, nc *nats.Conn, subject string, q node.LogsRequest, timeout time.Duration) (node.LogPage, error) {
	body, err := json.Marshal(q)
	if err != nil {
		return node.LogPage{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, subject, body)
	if err != nil {
		return node.LogPage{}, fmt.Errorf("logs of %s: %w", q.Module, err)
	}
	var r node.LogsReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return node.LogPage{}, fmt.Errorf("logs reply: %w", err)
	}
	if r.NoModule {
		// A module the node does not have: a name the stream does not
		// hold for it, exit 2 (unknownName).
		return node.LogPage{}, fmt.Errorf("logs of %s: %w (the node's agent runs no module of that name)", q.Module, node.ErrNoModule)
	}
	if r.Error != "" {
		return node.LogPage{}, errors.New(r.Error)
	}
	return r.LogPage, nil
}
