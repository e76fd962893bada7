package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/process"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

func init() { register(newNodeCmd) }

type nodeOpts struct {
	root       string
	stateDir   string
	runtimeDir string
	runtime    string
	resync     time.Duration
	checkFiles time.Duration
	healthHold time.Duration
	trust      trustFlag
}

func newNodeCmd(a *app) *cobra.Command {
	var o nodeOpts
	cmd := &cobra.Command{
		Use:   "node NAME --root DIR",
		Short: "Run a node agent: follow the node's plans, publish have/settle, judge and write filled files",
		Long: `node runs the agent of node NAME. It applies the node's newest plan, then
follows newer ones (an ordered consumer, no durable state on the server),
applies each through the runtime, switches the plan it judges writes by and
only then publishes the plan's settles. It publishes a full have whenever
what runs changes and every --resync.

It serves fill requests on <prefix>.NAME.fill (a NATS micro service,
"meshfold-node"; see 'nats micro ls'): each write is judged by the settled
plan and written atomically under --root (a plan path /run/x/key lands in
DIR/run/x/key with its declared mode), then reported as filled (with an
HMAC digest, never the content) or refused. Every --check-files (default
5s) it looks at the filled files it saw in place: one deleted on the node
(an rm, a cleanup cron) is reported missing in a have at once, the
reconciler knocks, and the provisioner fills it again while its module
runs.

--runtime process (the default) runs each module as a process (DESIGN.md
§8): its build is a bundle of the object store bucket <stream>_BUILDS
('meshfold build push'), fetched once into --state-dir/bundles and checked
against the build; its command starts as the Unix user runs_as (as root;
an agent that is not root runs every module as itself), supervised by a
small per-module process that restarts it with backoff, wakes it when one
of its files is filled, captures its output ('meshfold logs') and keeps it
running while the agent restarts. --runtime record starts nothing: each
applied module's build and account are written to --runtime-dir (default
DIR/.meshfold/modules, a directory fills may not write into), for dry runs.
Another engine plugs in through the Go interface node.Runtime.

The HMAC key is created once in --state-dir (mode 0700, key 0600). The
default is /var/lib/meshfold/node-NAME as root, else
$XDG_STATE_HOME/meshfold/node-NAME (~/.local/state/...). It must not be
inside --root.

It applies only plans signed by a key it was given, and says at start which
keys and from where: --trust-from DIR, DIR the --data (or --auth) directory
of the meshfold serve beside it, or --trust FILE (an auth directory's
reconcilers.pub, copied to the node). During a key rotation's overlap
(meshfold auth rotate-reconciler) it also applies the retired key's plans,
never one after a plan of the current key.

The event stream must exist: start 'meshfold serve' or 'meshfold reconcile'
first (until then the agent waits for it). It exits with status 1 when its
NATS connection is closed for good (its user revoked), so that its service
manager restarts it; the modules it runs keep running.`,
		Example: `  meshfold node ace --root /tmp/ace --trust-from meshfold-data   # beside 'meshfold serve'
  meshfold node ace --root /tmp/ace --trust-from meshfold-data --runtime record   # start nothing, record what would run
  meshfold node ace --root / --state-dir /var/lib/meshfold/node-ace --resync 5m --trust /etc/meshfold/reconcilers.pub
  meshfold node ace --root /srv/ace -s tls://hub.example:4222 --tls-ca ca.pem \
    --creds node-ace.creds --trust reconcilers.pub`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeNodes(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runNode(cmd, a, args[0], o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.root, "root", "", "directory filled files are written under (required; created if missing)")
	fl.StringVar(&o.stateDir, "state-dir", "", "directory of the agent's HMAC key (default: see above)")
	fl.StringVar(&o.runtime, "runtime", runtimeProcess, "how modules run: process (real processes) or record (start nothing)")
	fl.StringVar(&o.runtimeDir, "runtime-dir", "", "where the recording runtime keeps module records (default DIR/.meshfold/modules, DIR the --root)")
	fl.DurationVar(&o.resync, "resync", node.DefaultResync, "interval of the resync have (and of retrying a failed plan)")
	fl.DurationVar(&o.checkFiles, "check-files", node.DefaultCheckFiles, "interval of the look at the filled files on the node: one gone (an rm) is reported and refilled while its module runs; 0 never looks")
	fl.DurationVar(&o.healthHold, "health-hold", node.DefaultHealthHold, "how long a module's health check, reported unhealthy, must pass before a have reports it healthy again; doubles while it flaps, up to 5m")
	o.trust.add(cmd)
	_ = cmd.MarkFlagRequired("root")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// defaultStateDir is where the agent of node keeps its key by default.
func defaultStateDir(name string) (string, error) {
	if os.Geteuid() == 0 {
		return filepath.Join("/var/lib/meshfold", "node-"+name), nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "meshfold", "node-"+name), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("--state-dir: no default (%v): set it", err)
	}
	return filepath.Join(home, ".local", "state", "meshfold", "node-"+name), nil
}

func runNode(cmd *cobra.Command, a *app, name string, o nodeOpts) error {
	if !events.ValidName(name) {
		return withCode(exitUsage, &events.FieldError{Field: "NAME", Value: name, Err: events.ErrBadName})
	}
	if o.resync <= 0 {
		return withCode(exitUsage, fmt.Errorf("--resync %s: must be positive", o.resync))
	}
	if o.healthHold <= 0 {
		return withCode(exitUsage, fmt.Errorf("--health-hold %s: must be positive", o.healthHold))
	}
	if o.checkFiles < 0 {
		return withCode(exitUsage, fmt.Errorf("--check-files %s: must be positive, or 0 to never look", o.checkFiles))
	}
	if o.checkFiles == 0 {
		o.checkFiles = -1 // node.Config's "never"
	}
	log, err := a.logger()
	if err != nil {
		return err
	}
	if o.stateDir == "" {
		if o.stateDir, err = defaultStateDir(name); err != nil {
			return withCode(exitUsage, err)
		}
	}
	// Absolute from here on: the process runtime's shims run in "/", so
	// a relative --state-dir named bundle directories they never found
	// (every module failed to start, "removed since the module was
	// applied": a fresh user's finding).
	for _, dir := range []*string{&o.root, &o.stateDir, &o.runtimeDir} {
		if *dir != "" {
			if *dir, err = filepath.Abs(*dir); err != nil {
				return withCode(exitUsage, err)
			}
		}
	}
	if err := node.CheckStateDir(o.root, o.stateDir); err != nil {
		return withCode(exitUsage, err) // before either directory is made
	}
	if err := os.MkdirAll(o.root, 0o755); err != nil {
		return fmt.Errorf("--root: %w", err)
	}
	if o.runtime != runtimeProcess && o.runtime != runtimeRecord {
		return withCode(exitUsage, fmt.Errorf("--runtime %q: want %s or %s", o.runtime, runtimeProcess, runtimeRecord))
	}
	// One node per root: another node's agent on it would overwrite its
	// filled files, and its retire delete them (a fresh user's finding
	// U35). Held for the agent's life.
	root := o.root
	releaseRoot, _, warn, err := node.LockRoot(root, name)
	if err != nil {
		return withCode(exitUsage, err)
	}
	defer releaseRoot()
	if warn != nil {
		log.Warn("the root is not locked for this node: an agent of another node on it is not refused", "err", warn)
	}
	// Before anything runs on it: another node's state directory holds
	// that node's shims and bundles (a fresh user's finding U19).
	adopted, err := node.ClaimStateDir(o.stateDir, name)
	if err != nil {
		if errors.Is(err, node.ErrStateDirOwned) {
			return withCode(exitUsage, err)
		}
		return err
	}
	if adopted {
		node.LogAdopted(log, o.stateDir, name)
	}
	// Nor may it start the node's modules a second time beside shims of
	// another state directory (a wiped or moved one: a fresh user's
	// finding U33).
	if o.runtime == runtimeProcess {
		if others := process.Others(name, root, o.stateDir); len(others) > 0 {
			return withCode(exitUsage, &process.OthersError{Node: name, Root: root, StateDir: o.stateDir, Others: others})
		}
	}

	trust, trustPath, err := o.trust.load()
	if err != nil {
		return err
	}
	sayTrust(a, "node agent "+name, trust, trustPath)
	nc, err := a.conn.connectWait(cmd.Context(), "meshfold-node-"+name, a)
	if err != nil {
		return err
	}
	defer nc.Close()
	// A permission the creds lack while the agent starts (its lease
	// claimed, its first plan applied) ends it at once, explained (exit
	// 1): creds of another role are no transient failure (a fresh user's
	// finding 6). Once started, a violation is logged as before.
	started := make(chan struct{})
	a.watchDeniedUntil(nc, started)
	a.deniedNeeds = fmt.Sprintf("'meshfold node %s' runs as the node role, user %s ('meshfold auth add-node %s' writes its creds file)",
		name, auth.UserName(auth.RoleNode, name), name)
	// A connection closed for good (a revoked user) ends the agent with an
	// error: it would never reconnect, and systemd's Restart= brings it back.
	err = store.WhileConnected(cmd.Context(), nc, func(ctx context.Context) error {
		return runNodeAgent(ctx, a, name, o, nc, trust, trustPath, log, started)
	})
	if d := a.deniedErr(); d != nil {
		return d // ended by the violation, which run explains
	}
	return err
}

// runNodeAgent runs the agent of node name on nc until ctx is done,
// closing started once the agent has started (node.Agent.Ready).
func runNodeAgent(ctx context.Context, a *app, name string, o nodeOpts, nc *nats.Conn, trust *store.Trust, trustPath string, log *slog.Logger, started chan<- struct{}) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, scfg, err := a.stream.openStreamWait(ctx, js, log)
	if err != nil {
		return err
	}
	rt, release, err := nodeRuntime(o.runtime, name, o.root, o.stateDir, o.runtimeDir, js, scfg.Name, log)
	if err != nil {
		return err
	}
	defer release()
	tp, stopTracing, err := a.startTracing(ctx, "meshfold-node", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	agent, err := node.New(nc, js, node.Config{Name: name, Root: o.root, StateDir: o.stateDir, Runtime: rt,
		Resync: o.resync, CheckFiles: o.checkFiles, HealthHold: o.healthHold, Logger: log, Stream: scfg, Trust: trust, TrustFrom: trustPath, Tracing: tp})
	if err != nil {
		return withCode(exitUsage, err)
	}
	go func() {
		select {
		case <-agent.Ready():
			close(started)
		case <-ctx.Done():
		}
	}()
	return agent.Run(ctx)
}
