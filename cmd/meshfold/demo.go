package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/examples"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/node/process"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
)

func init() { register(newDemoCmd) }

// demoStep bounds each step of the demo.
const demoStep = 30 * time.Second

func newDemoCmd(a *app) *cobra.Command {
	var (
		dir  string
		keep bool
		logs bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Play incident 1 on node ace with a real crash-looping module, everything in one process",
		Long: `demo starts everything in this process, in a temporary directory: an embedded
NATS server with JetStream, the event stream, the reconciler, and the node agent
of node "ace" with the process runtime (filled files under DIR/ace-root, its
state and bundle cache in DIR/ace-state). It pushes two bundles to the object
store: examples/mesh-build-go, a script that exits 1 saying "missing broker
credential" while its credential file is missing, and examples/idle, a stand-in
for the provisioner. Then it plays incident 1 of DESIGN.md §2:

  1. the controller wants the provisioner alone on ace; the plan settles;
  2. the provisioner places mesh-build-go's broker credential before any
     declaration names it: the node refuses it as undeclared;
  3. the controller wants mesh-build-go with that file; the node starts it,
     it finds no credential and exits 1, and its have says failed: a crash
     loop; the settle makes the reconciler publish one knock;
  4. the provisioner, knocked, fills again (the demo plays the provisioner
     client's fill pass itself once the crash shows, so every step is seen):
     the file is written, the module is woken at once and runs.

It prints ace's timeline as 'meshfold audit ace' would, the file written, why
the knock was published, and the module's own output as 'meshfold logs ace
mesh-build-go' shows it. Modules run as nobody when the demo runs as root,
else as the current user. Every module is stopped at the end; nothing outside
DIR is touched; DIR is removed unless --keep or --dir is given. A --dir that
holds a previous run is refused: give a new one, or remove it.`,
		Example: `  make demo
  meshfold demo --keep          # keep the directory to look at the files
  meshfold demo --logs          # also show every component's log lines`,
		Args: noArgs(""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), a, dir, keep, logs)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&dir, "dir", "", "directory to run in (default: a new temporary one)")
	fl.BoolVar(&keep, "keep", false, "keep the directory at the end")
	fl.BoolVar(&logs, "logs", false, "show the components' log lines on stderr")
	return cmd
}

// demoMesh is what the demo runs.
type demoMesh struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	cfg    store.StreamConfig
	pub    *store.Publisher
	rc     atomic.Pointer[engine.Reconciler]
	events *store.Tail // every event of ace, in stream order
	rt     *process.Runtime
	nc     *nats.Conn
}

// demoAccount is the account the demo's modules run as: nobody under
// root (so the module runs as another user), else the current user (an
// agent that is not root runs modules as itself; runs_as must still name a
// user).
func demoAccount() (string, error) {
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("nobody"); err == nil {
			return "nobody", nil
		}
	}
	u, err := user.Current()
	if err != nil {
		return "", err
	}
	return u.Username, nil
}

func runDemo(ctx context.Context, a *app, dir string, keep, showLogs bool) (err error) {
	log := slog.New(slog.DiscardHandler)
	if showLogs {
		if log, err = a.logger(); err != nil {
			return err
		}
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "meshfold-demo-"); err != nil {
			return err
		}
		if !keep {
			// The commands printed name files under dir: say that it
			// is gone, and how to keep it (a fresh user's finding
			// U27: `make demo` printed a --why to run, then removed
			// what it reads).
			defer func() {
				if os.RemoveAll(dir) == nil {
					fmt.Fprintln(a.stdout, demoRemoved(dir))
				}
			}()
		}
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	if err := demoDirFree(dir); err != nil {
		return withCode(exitUsage, err)
	}
	acct, err := demoAccount()
	if err != nil {
		return err
	}
	const name = "ace"
	root, state, secrets := filepath.Join(dir, "ace-root"), filepath.Join(dir, "ace-state"), filepath.Join(dir, "secrets")
	for _, d := range []string{root, secrets} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The module's account reaches its bundle (under the state dir) and
	// its root.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	if err := searchable(filepath.Dir(dir), acct); err != nil {
		return withCode(exitUsage, err)
	}
	credsPath := examples.MeshBuildGoCreds
	src := filepath.Join(secrets, "mesh-build-go", filepath.FromSlash(credsPath))
	if err := os.MkdirAll(filepath.Dir(src), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(src, []byte("demo broker credential for ace\n"), 0o600); err != nil {
		return err
	}

	srv, err := embedded.Start(embedded.Config{DataDir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	fmt.Fprintf(a.stdout, "meshfold demo: incident 1 on node %s, in %s\nNATS at %s (stream %s); modules run as %s\n\n",
		name, dir, srv.ClientURL(), store.DefaultStreamName, acct)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stops []func()
	defer func() {
		cancel()
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	// start runs one component on its own connection until the demo ends.
	start := func(what string, run func(nc *nats.Conn, js jetstream.JetStream) error) error {
		nc, err := srv.Connect(nats.Name("meshfold-demo-" + what))
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return err
		}
		done := make(chan error, 1)
		go func() { done <- run(nc, js) }()
		stops = append(stops, sync.OnceFunc(func() {
			if err := <-done; err != nil {
				fmt.Fprintf(a.stderr, "meshfold demo: %s: %v\n", what, err)
			}
			nc.Close()
		}))
		return nil
	}

	m := &demoMesh{}
	nc, err := srv.Connect(nats.Name("meshfold-demo"))
	if err != nil {
		return err
	}
	defer nc.Close()
	m.nc = nc
	if m.js, err = jetstream.New(nc); err != nil {
		return err
	}
	if m.stream, m.cfg, err = store.EnsureStream(ctx, m.js, store.StreamConfig{}); err != nil {
		return err
	}
	m.pub = store.NewPublisher(m.js, m.cfg.Subjects())
	if m.events, err = store.Follow(ctx, m.js, store.TailConfig{Stream: m.cfg.Name, Subjects: m.cfg.Subjects(), Filter: m.cfg.Subjects().StoredNode(name)}); err != nil {
		return err
	}
	defer m.events.Stop()

	// The bundles, as 'meshfold build push' stores them.
	builds := bundle.NewStore(m.js, m.cfg.Name)
	idle, err := demoPush(ctx, a.stdout, builds, dir, examples.WriteIdle)
	if err != nil {
		return err
	}
	mbgBuild, err := demoPush(ctx, a.stdout, builds, dir, examples.WriteMeshBuildGo)
	if err != nil {
		return err
	}
	fmt.Fprintln(a.stdout)

	// Plans and knocks are signed, and verified by the agent and the
	// provisioner, as in a real mesh.
	kp, err := store.NewSigningKey()
	if err != nil {
		return err
	}
	signer, err := store.NewSigner(kp)
	if err != nil {
		return err
	}
	trust, err := store.NewTrust(signer.PublicKey())
	if err != nil {
		return err
	}
	if err := start("reconciler", func(nc *nats.Conn, _ jetstream.JetStream) error {
		return engine.Serve(ctx, nc, engine.Config{Stream: m.cfg, Logger: log.With("component", "reconciler"), Signer: signer,
			Ready: func(_ context.Context, r *engine.Reconciler) { m.rc.Store(r) }})
	}); err != nil {
		return err
	}
	if m.rt, err = openProcessRuntime(name, root, state, m.js, m.cfg.Name, log); err != nil {
		return err
	}
	// Last out: stop every module, so the demo leaves no process behind.
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), demoStep)
		defer scancel()
		m.rt.StopAll(sctx)
		_ = m.rt.Close()
	}()
	// The agent stops before the reconciler (stopAgent), so that the
	// reconciler records its down.
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	if err := start("node", func(nc *nats.Conn, js jetstream.JetStream) error {
		agent, err := node.New(nc, js, node.Config{Name: name, Root: root, StateDir: state, Runtime: m.rt,
			Stream: m.cfg, Logger: log.With("component", "node"), Trust: trust})
		if err != nil {
			return err
		}
		return agent.Run(actx)
	}); err != nil {
		return err
	}
	stopNode := stops[len(stops)-1]
	stopAgent := func() { acancel(); stopNode() }
	provisioner := events.WantModule{Name: "provisioner", Build: idle, RunsAs: acct, Provisioner: true}
	mbg := events.WantModule{Name: "mesh-build-go", Build: mbgBuild, RunsAs: acct,
		Files: []events.File{{Path: credsPath, Mode: "0600"}}}

	// 1. The provisioner alone; wait until its plan settled.
	w1, err := m.want(ctx, name, provisioner)
	if err != nil {
		return err
	}
	p1, err := m.waitFor(ctx, "the plan of the first want", func(ev events.Event) bool {
		p, ok := ev.Payload.(*events.Plan)
		return ok && p.Cause == w1
	})
	if err != nil {
		return err
	}
	if _, err := m.waitFor(ctx, "the settle of that plan", func(ev events.Event) bool {
		s, ok := ev.Payload.(*events.Settle)
		return ok && s.Plan == p1.Seq
	}); err != nil {
		return err
	}

	// 2. The credential placed before any declaration names it.
	// The provisioner client: its early write now, its fill pass on the
	// knock below.
	// Its fill statuses and its knock answers go where a provisioner's
	// do: `state` and `fleet` of the demo's data read them.
	status, err := store.OpenFillStatus(ctx, m.js, m.cfg, true)
	if err != nil {
		return err
	}
	early, err := provision.New(nc, m.js, provision.Config{Node: name, From: secrets, Account: acct,
		Stream: m.cfg, Logger: log.With("component", "provision"), Trust: trust, Status: status})
	if err != nil {
		return err
	}
	content, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	fctx, fcancel := context.WithTimeout(ctx, demoStep)
	reply, err := early.Request(fctx, "mesh-build-go", credsPath, content)
	fcancel()
	if err != nil {
		return fmt.Errorf("the early fill: %w", err)
	}
	if reply.OK {
		return errors.New("the early write was accepted: the incident did not happen")
	}

	// 3. The declaration: the module starts, crashes; the knock.
	w2, err := m.want(ctx, name, provisioner, mbg)
	if err != nil {
		return err
	}
	var knocked, failed bool
	var knock events.Event
	var applyErr error
	if _, err := m.waitFor(ctx, "the knock and mesh-build-go's crash", func(ev events.Event) bool {
		switch p := ev.Payload.(type) {
		case *events.Knock:
			if ev.Seq > w2 {
				knocked, knock = true, ev
			}
		case *events.Settle:
			if p.Op == events.OpFailed {
				applyErr = fmt.Errorf("the node could not apply plan #%d: %s", p.Plan, events.ErrorText(p.Error))
			}
		case *events.Have:
			for _, hm := range p.Modules {
				if hm.Name != mbg.Name || hm.State != events.Failed {
					continue
				}
				if hm.Exit != "status 1" { // not its crash: it could not start
					applyErr = fmt.Errorf("mesh-build-go did not start: %s", hm.Exit)
				}
				failed = true
			}
		}
		return applyErr != nil || knocked && failed
	}); err != nil {
		return err
	}
	if applyErr != nil {
		return applyErr
	}

	// 4. The provisioner's fill pass, as a knock makes it: it takes the
	// knock (its answer recorded, as a provisioner's is: a fresh user's
	// finding 3b, fleet said no provisioner answered it), then fills.
	early.Answer(ctx, knock)
	if _, err := early.FillOnce(ctx); err != nil {
		return err
	}
	running, err := m.waitFor(ctx, "mesh-build-go to run", func(ev events.Event) bool {
		p, ok := ev.Payload.(*events.Have)
		return ok && slices.ContainsFunc(p.Modules, func(hm events.HaveModule) bool {
			return hm.Name == mbg.Name && hm.State == events.Running && hm.Restarts > 0
		})
	})
	if err != nil {
		return err
	}
	if err := m.folded(ctx, name, running.Seq); err != nil {
		return err
	}
	if err := m.print(ctx, a.stdout, name, root, credsPath); err != nil {
		return err
	}
	return m.windDown(ctx, a.stdout, name, stopAgent)
}

// windDown ends the demo as the mesh records an end: a want of no module
// stops the node's modules through its agent (its have then says none
// runs), then the agent stops, releasing its lease, and the reconciler
// records its down before the demo stops the reconciler. Without it the
// stream left in DIR/nats ended with the modules running and the agent up,
// and a 'meshfold serve --data DIR/nats' recorded the agent's down at its
// own start and showed in 'state' modules that no longer ran.
func (m *demoMesh) windDown(ctx context.Context, w io.Writer, name string, stopAgent func()) error {
	none, err := m.want(ctx, name, []events.WantModule{}...)
	if err != nil {
		return err
	}
	if _, err := m.waitFor(ctx, "the modules to stop", func(ev events.Event) bool {
		h, ok := ev.Payload.(*events.Have)
		return ok && ev.Seq > none && !slices.ContainsFunc(h.Modules, func(hm events.HaveModule) bool { return hm.State != events.Stopped })
	}); err != nil {
		return err
	}
	stopAgent()
	down, err := m.waitFor(ctx, "the agent's down", func(ev events.Event) bool {
		p, ok := ev.Payload.(*events.Agent)
		return ok && p.State == events.AgentDown
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nstopped: %s's modules by a want of none (#%d), then its agent (its down is #%d)\n", name, none, down.Seq)
	return nil
}

// demoRemoved is the demo's last line when it removed its temporary
// directory.
func demoRemoved(dir string) string {
	return fmt.Sprintf("removed %s; `meshfold demo --dir DIR` keeps it to audit", dir)
}

// demoDirFree refuses a --dir that holds a previous run (its nats
// directory): the demo would append to that run's stream, and its
// timeline would start with the old run and a plan refused as signed by
// a key that no longer exists (a fresh user's finding U27).
func demoDirFree(dir string) error {
	fi, err := os.Stat(filepath.Join(dir, "nats"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("--dir: %s holds a demo from %s: give a new --dir or remove it", dir, fi.ModTime().Format("2006-01-02 15:04"))
}

// searchable checks that every directory from dir up is searchable by
// others when modules run as another account than the demo's, so that
// they reach their bundle and their files under the demo's directory.
func searchable(dir, acct string) error {
	if u, err := user.Current(); err != nil || u.Username == acct {
		return nil
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("--dir: %s is not searchable by other users (mode %04o), so modules running as %s could not reach their bundles: choose a directory under /tmp", d, fi.Mode().Perm(), acct)
		}
		if filepath.Dir(d) == d {
			return nil
		}
	}
}

// demoPush packs an example bundle and stores it, printing its build, size
// and push time.
func demoPush(ctx context.Context, w io.Writer, st *bundle.Store, dir string, write func(string) (string, error)) (string, error) {
	src, err := write(filepath.Join(dir, "bundles"))
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	p, err := bundle.Pack(src, &b)
	if err != nil {
		return "", err
	}
	start := time.Now()
	if _, _, err := st.Push(ctx, p.Build, filepath.Base(src), &b); err != nil {
		return "", err
	}
	fmt.Fprintf(w, "meshfold build push %s → %s (%d bytes, %s)\n", filepath.Base(src), p.Build, p.Size,
		time.Since(start).Round(100*time.Microsecond))
	return p.Build, nil
}

func (m *demoMesh) want(ctx context.Context, node string, mods ...events.WantModule) (uint64, error) {
	ack, err := m.pub.Append(ctx, node, events.Stamp(&events.Want{Modules: mods}, time.Now()))
	return ack.Seq, err
}

// waitFor reads the node's events until pred holds, for at most demoStep.
func (m *demoMesh) waitFor(ctx context.Context, what string, pred func(events.Event) bool) (events.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, demoStep)
	defer cancel()
	for {
		msg, err := m.events.Next(ctx)
		if err != nil {
			return events.Event{}, fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ev := msg.Event; ev.Err == nil && pred(ev) {
			return ev, nil
		}
	}
}

// folded waits until the reconciler has folded the node's events up to seq,
// so the timeline is complete.
func (m *demoMesh) folded(ctx context.Context, node string, seq uint64) error {
	ctx, cancel := context.WithTimeout(ctx, demoStep)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if r := m.rc.Load(); r != nil {
			if st, ok := r.Node(node); ok && st.Seq >= seq {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the reconciler to fold #%d: %w", seq, ctx.Err())
		case <-tick.C:
		}
	}
}

// print writes the node's timeline, the file and why the knock came.
func (m *demoMesh) print(ctx context.Context, w io.Writer, name, root, path string) error {
	r, err := query.New(m.nc, query.Config{Stream: m.cfg})
	if err != nil {
		return err
	}
	h, err := r.History(ctx, name, query.Bounds{})
	if err != nil {
		return err
	}
	entries := h.Timeline(0, len(h.Events))
	width := audit.SeqWidth(entries)
	fmt.Fprintf(w, "timeline of %s (meshfold audit %s):\n", name, name)
	var knock, filled *audit.Entry
	for i, e := range entries {
		fmt.Fprintln(w, "  "+e.Line(width))
		switch e.Kind {
		case events.KindKnock:
			knock = &entries[i]
		case events.KindFilled:
			filled = &entries[i]
		}
	}
	if knock == nil || filled == nil {
		return errors.New("no knock and filled in the timeline")
	}
	full := filepath.Join(root, filepath.FromSlash(path))
	fi, err := os.Stat(full)
	if err != nil {
		return fmt.Errorf("the file is not written: %w", err)
	}
	fmt.Fprintf(w, "\nfile written: %s (mode %04o, %d bytes), reported by filled #%d\n", full, fi.Mode().Perm(), fi.Size(), filled.Seq)
	why, err := h.Why(knock.Seq)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "because of knock #%d (meshfold audit %s --why %d):\n%s", knock.Seq, name, knock.Seq, why.Text())
	// Through the agent's logs endpoint, as 'meshfold logs' reads them.
	page, err := requestLogs(ctx, m.nc, node.LogsSubject(m.cfg.Prefix, name),
		node.LogsRequest{Module: "mesh-build-go", LogQuery: node.LogQuery{Tail: 20}}, demoStep)
	if err != nil {
		return fmt.Errorf("the module's logs: %w", err)
	}
	fmt.Fprintf(w, "\nits own output (meshfold logs %s mesh-build-go):\n", name)
	for _, l := range page.Lines {
		fmt.Fprintln(w, "  "+audit.Clip(l, audit.LineWidth-2))
	}
	return nil
}
