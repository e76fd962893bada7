package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
)

func init() { register(newBuildCmd) }

func newBuildCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Module bundles in the object store: push, ls, rm",
		Example: `  BUILD=$(meshfold build push ./mesh-build-go)   # an executable, or a directory with meshfold.json
  meshfold build ls
  meshfold want ace -f ace.json --new            # a want whose module says "build": "$BUILD"
  meshfold build rm "$BUILD"                     # refused, exit 3: ace's want names it`,
		Long: `build manages module bundles (DESIGN.md §8). A bundle is a tar.gz with a
manifest, meshfold.json, at its top; its build is "sha256:<hex>" of its bytes,
and it is kept in the JetStream object store bucket <stream>_BUILDS (MESH_BUILDS
by default), where node agents running the process runtime fetch it from.
Name a bundle's build in a want to run it.

The manifest:
  {"command": ["bin/run", "--flag"],      argv, required; a relative command[0]
                                          is a file of the bundle
   "env": {"NAME": "value"},              added to the environment (no secrets)
   "stop_signal": "SIGTERM",              then SIGKILL after
   "stop_timeout": "10s",
   "on_fill": "none",                     or "restart" or "signal:SIGHUP": what a
                                          running module gets when a file of
                                          its is filled
   "limits": {"memory": 268435456,        optional, applied to the module's
              "cpu": 0.5, "pids": 128},   cgroup: bytes, cores, processes
   "health": {"http": "http://127.0.0.1:8080/healthz",
                                          or "exec": [argv] (exit 0, run as the
                                          module's account), "tcp": "host:port"
                                          (connects), "notify": true (systemd's
                                          READY=1, WATCHDOG=1 each interval)
              "interval": "10s", "timeout": "1s", "grace": "30s",
              "failures": 3,              consecutive, after the grace
              "restart": true}}           restart an unhealthy module (backoff)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withCode(exitUsage, errors.New("build needs a subcommand: push, ls or rm (see meshfold build --help)"))
		},
	}
	cmd.AddCommand(newBuildPushCmd(a), newBuildLsCmd(a), newBuildRmCmd(a))
	return cmd
}

func newBuildPushCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "push PATH",
		Short: "Store a bundle made from an executable or a directory, and print its build",
		Long: `push packs PATH into a bundle and stores it, then prints its build on stdout
(notes go to stderr), so a script can take it: BUILD=$(meshfold build push ./x).

PATH is an executable file (the bundle holds it and a generated manifest that
runs it with no arguments) or a directory with a meshfold.json at its top (see
meshfold build --help), which is validated before anything is stored: unknown
fields, an empty command, a bad signal, a relative command that is not an
executable of the directory are refused, naming the field.

Packing is deterministic (entries sorted, fixed times, owners and modes): the
same content gives the same build, and pushing it again stores nothing new.
The bucket is created on the first push.`,
		Example: `  meshfold build push ./mesh-build-go            # an executable
  meshfold build push ./bundles/mesh-build-go/   # a directory with meshfold.json
  BUILD=$(meshfold build push ./mesh-build-go) && echo "$BUILD"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBuildPush(cmd.Context(), a, args[0], asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object (build, size, pushed, from, existed)")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// pushReply is what `build push --json` prints.
type pushReply struct {
	bundle.Info
	Existed bool `json:"existed"`
}

func runBuildPush(ctx context.Context, a *app, path string, asJSON bool) error {
	// Pack first, into a temporary file: a bad PATH or manifest is refused
	// before any connection.
	tmp, err := os.CreateTemp("", "meshfold-bundle-*.tar.gz")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	p, err := bundle.Pack(path, tmp)
	if errors.Is(err, bundle.ErrPack) || errors.Is(err, bundle.ErrInvalidManifest) {
		return withCode(exitUsage, err)
	}
	if err != nil {
		return err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	nc, js, err := a.connectJS("meshfold-build")
	if err != nil {
		return err
	}
	defer nc.Close()
	st := bundle.NewStore(js, a.stream.name)
	start := time.Now()
	info, existed, err := st.Push(ctx, p.Build, filepath.Base(filepath.Clean(path)), tmp)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(a.stdout, pushReply{Info: info, Existed: existed})
	}
	what := fmt.Sprintf("pushed %s to %s in %s", humanBytes(info.Size), st.Bucket(), time.Since(start).Round(time.Millisecond))
	if existed {
		what = fmt.Sprintf("already in %s (%s, pushed %s): nothing sent", st.Bucket(), humanBytes(info.Size), info.Pushed.Format(time.RFC3339))
	}
	if p.Generated {
		what += fmt.Sprintf("; manifest generated: command [%q]", p.Manifest.Command[0])
	}
	fmt.Fprintf(a.stderr, "meshfold: %s\n", what)
	_, err = fmt.Fprintln(a.stdout, p.Build)
	return err
}

func newBuildLsCmd(a *app) *cobra.Command {
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the stored bundles, newest first",
		Long: `ls lists every bundle of the bucket, newest first: its build, size, when it
was pushed and what was packed. An empty or missing bucket lists nothing.`,
		Example: `  meshfold build ls
  meshfold build ls -o json | jq -r .build
  meshfold build ls -o yaml`,
		Args: noArgs(""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := out.get()
			if err != nil {
				return err
			}
			return runBuildLs(cmd.Context(), a, format)
		},
	}
	out.add(cmd, "print JSON lines, one bundle a line (-o json)")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

func runBuildLs(ctx context.Context, a *app, format string) error {
	nc, js, err := a.connectJS("meshfold-build")
	if err != nil {
		return err
	}
	defer nc.Close()
	st := bundle.NewStore(js, a.stream.name)
	list, err := st.List(ctx)
	if err != nil {
		return err
	}
	if format != outTable {
		for _, i := range list {
			if err := writeValue(a.stdout, format, i); err != nil {
				return err
			}
		}
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-71s %9s %-20s %s\n", "BUILD", "SIZE", "PUSHED", "FROM")
	for _, i := range list {
		fmt.Fprintf(&b, "%-71s %9s %-20s %s\n", i.Build, humanBytes(i.Size), i.Pushed.UTC().Format(time.RFC3339), audit.Clip(i.From, 40))
	}
	fmt.Fprintf(&b, "-- %d in %s\n", len(list), st.Bucket())
	_, err = io.WriteString(a.stdout, b.String())
	return err
}

func newBuildRmCmd(a *app) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm BUILD [--force]",
		Short: "Delete a stored bundle that nothing names any more",
		Long: `rm deletes the bundle stored under BUILD, unless something still names it:

  - a node's newest want (a node retired since is not counted);
  - a node's newest have (what its agent runs);
  - the newest rollout of a fleet, whose revert (the revert verb, or
    auto_revert on a failure) would give nodes their previous want back,
    one naming BUILD;
  - the newest rollout of a fleet that has yet to give nodes a new want
    naming BUILD (loading, running or waiting for a promote: its next
    steps, even before a controller took the first).

Then it removes nothing and exits 3, naming those nodes and rollouts (a
count and the first few). A node that has not cached a bundle, or whose
cache let it go, fetches it again from the bucket: once it is removed,
its apply of a want naming it, or a revert to it, fails with "no such
bundle" and the module stays down. Move them off it first (apply a fleet
file naming another build; a new apply supersedes a rollout, which can then
no longer revert), then rm again. --force removes it anyway and says what
it breaks. BUILD may be the short form messages print (sha256: and 12 hex
digits or more) of the one stored build it begins.

The check reads each node's newest want, have and retire from the stream
(one pass per kind that delivers only the newest of each node) and each
fleet's newest rollout (docs/operations.md, "Bundles").

A want or apply that runs while rm does may find the build stored and
publish after rm checked: once the bundle is removed, rm reads the wants
and rollout starts published since its check began, and when one names
the build it says so and exits 1 (push the build again to mend it). A
publish that lands after that read is said by the want or apply itself,
which checks its builds again once published (exit 1 too). On a
replicated stream a replica behind its leader may answer that check, so
rm a build only once nobody is about to name it (docs/architecture.md,
"build rm's window").`,
		Example: `  meshfold build ls -o json | jq -r .build   # the builds stored, newest first
  meshfold build rm "$BUILD"                 # refused, exit 3, while a want, a have or a rollout names it
  meshfold build rm "$BUILD" --force         # named still: remove it anyway`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBuildRm(cmd.Context(), a, args[0], force)
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove a build that wants, haves or a rollout's steps or revert still name (they then fail to fetch it)")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

func runBuildRm(ctx context.Context, a *app, build string, force bool) error {
	build, err := a.resolveBuildPrefix(ctx, build)
	if err != nil {
		return err
	}
	if _, err := bundle.ParseBuild(build); err != nil {
		return withCode(exitUsage, withNearest(ctx, a, build, err))
	}
	nc, js, err := a.connectJS("meshfold-build")
	if err != nil {
		return err
	}
	defer nc.Close()
	st := bundle.NewStore(js, a.stream.name)
	if _, err := st.Stat(ctx, build); errors.Is(err, bundle.ErrNotFound) || errors.Is(err, bundle.ErrNoBucket) {
		// Not pushed (exit 1, as the table says of a build not pushed).
		known, _ := listBuilds(ctx, st)
		return fmt.Errorf("%w: nothing to remove%s", err, nearestText(build, known))
	} else if err != nil {
		return err
	}
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return err
	}
	use, err := r.BuildUse(ctx, build)
	if err != nil && !force {
		return fmt.Errorf("could not tell what names %s, so nothing was removed: %w (--force removes it unchecked)", bundle.Short(build), err)
	}
	if err == nil && use.InUse() && !force {
		return withCode(exitConflict, fmt.Errorf("refused: %s is still named; nothing was removed:%s\n"+
			"a node without it in its cache fetches it from %s: once removed, its apply, or a revert to it, fails with \"no such bundle\" "+
			"and the module stays down. Move them off it first (apply a fleet file naming another build; a new apply supersedes a rollout, "+
			"which can then no longer revert), then rm again; --force removes it anyway",
			bundle.Short(build), useText(use), st.Bucket()))
	}
	buildRmChecked()
	if err := st.Remove(ctx, build); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "meshfold: removed %s from %s\n", bundle.Short(build), st.Bucket())
	if err == nil {
		// What was published between the check and the removal (a want
		// or apply that found the build stored): said, and exit 1, so
		// that it is pushed again (a reviewer's finding: the window was
		// silent). docs/architecture.md, "build rm's window".
		if meanwhile := namedMeanwhile(ctx, r, build, use.Last); meanwhile != "" {
			return fmt.Errorf("%s was named while rm checked it:%s\n"+
				"each of those nodes that has not cached it fails to apply it with \"no such bundle\": push it again (meshfold build push PATH of the same content gives the same build)",
				bundle.Short(build), meanwhile)
		}
	}
	switch {
	case err != nil:
		fmt.Fprintf(a.stderr, "warning: --force: removed unchecked (what names it could not be read: %v)\n", err)
	case use.InUse():
		fmt.Fprintf(a.stderr, "warning: --force: it was still named:%s\n"+
			"each of those nodes that has not cached it now fails to apply it, or to revert to it, with \"no such bundle\"; push it again (meshfold build push PATH of the same content gives the same build) to mend that\n",
			useText(use))
	}
	return nil
}

// useFirst is how many nodes a line of useText names before "… and N more".
const useFirst = 5

// useText says who names a build, a line each: wants, haves, rollouts.
func useText(u query.BuildUse) string {
	var b strings.Builder
	names := func(nodes []string) string {
		s := strings.Join(nodes[:min(len(nodes), useFirst)], ", ")
		if len(nodes) > useFirst {
			s += fmt.Sprintf(" and %d more", len(nodes)-useFirst)
		}
		return s
	}
	// "1 node wants it (its newest want)", "2 nodes want it (their …)".
	verb := func(n int, one, many string) string {
		if n == 1 {
			return one
		}
		return many
	}
	if n := len(u.Wants); n > 0 {
		fmt.Fprintf(&b, "\n  %s %s: %s", plural(n, "node"), verb(n, "wants it (its newest want)", "want it (their newest want)"), names(u.Wants))
	}
	if n := len(u.Runs); n > 0 {
		fmt.Fprintf(&b, "\n  %s %s: %s", plural(n, "node"), verb(n, "runs it (its newest have)", "run it (their newest have)"), names(u.Runs))
	}
	for _, ru := range u.Steps {
		fmt.Fprintf(&b, "\n  rollout %d of fleet %s (%s): its next steps give %s a want naming it: %s ('meshfold rollout status %s')",
			ru.Rollout, ru.Fleet, ru.Phase, plural(len(ru.Nodes), "node"), names(ru.Nodes), ru.Fleet)
	}
	for _, ru := range u.Reverts {
		fmt.Fprintf(&b, "\n  rollout %d of fleet %s (%s): a revert gives %s a previous want naming it: %s ('meshfold rollout status %s')",
			ru.Rollout, ru.Fleet, ru.Phase, plural(len(ru.Nodes), "node"), names(ru.Nodes), ru.Fleet)
	}
	if u.Snapshots {
		b.WriteString("\n  (the stream no longer holds its oldest events: nodes whose newest want or have went with them were read from their snapshots)")
	}
	return b.String()
}

// listBuilds lists the stored bundles for an error's nearest builds,
// within a second (an error's words are not worth a longer wait). The
// operator and the controller may list the bucket.
func listBuilds(ctx context.Context, st *bundle.Store) ([]bundle.Info, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return st.List(ctx)
}

// withNearest is err followed by the stored builds nearest to build,
// read on a connection of its own (build rm refuses a malformed build
// before connecting).
func withNearest(ctx context.Context, a *app, build string, err error) error {
	nc, cerr := a.conn.connect("meshfold-build", a)
	if cerr != nil {
		return err
	}
	defer nc.Close()
	js, cerr := jetstream.New(nc)
	if cerr != nil {
		return err
	}
	known, _ := listBuilds(ctx, bundle.NewStore(js, a.stream.name))
	return fmt.Errorf("%w%s", err, nearestText(build, known))
}

// nearestBuilds is how many stored builds an error names as the nearest.
const nearestBuilds = 3

// nearestText names the stored builds nearest to build
// (bundle.Nearest), one a line, or says none is stored; "" when the
// list could not be read.
func nearestText(build string, known []bundle.Info) string {
	if known == nil {
		return ""
	}
	if len(known) == 0 {
		return "\n  no build is stored yet: 'meshfold build push PATH' stores one and prints its build"
	}
	near, close_ := bundle.Nearest(build, known, nearestBuilds)
	head := "the nearest stored"
	if !close_ {
		head = fmt.Sprintf("none is near it; the newest stored (%d in all, 'meshfold build ls')", len(known))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n  %s:", head)
	for _, i := range near {
		fmt.Fprintf(&b, "\n    %s  from %s, pushed %s", i.Build, audit.Clip(i.From, 40), i.Pushed.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// humanBytes formats a size: 812 B, 3.4 KiB, 12.0 MiB.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 3; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGT"[exp])
}

// buildRmChecked runs between build rm's check and its removal: tests
// publish there what a concurrent want would.
var buildRmChecked = func() {}

// namedMeanwhile says what named build among the events stored after
// seq last (query.Reader.NamedSince), a line each; "" when nothing did,
// or when that could not be read (said on the line then).
func namedMeanwhile(ctx context.Context, r *query.Reader, build string, last uint64) string {
	wants, starts, err := r.NamedSince(ctx, build, last)
	if err != nil {
		return "\n  (what was published since the check could not be read: " + err.Error() + ")"
	}
	var b strings.Builder
	if n := len(wants); n > 0 {
		s := strings.Join(wants[:min(n, useFirst)], ", ")
		if n > useFirst {
			s += fmt.Sprintf(" and %d more", n-useFirst)
		}
		fmt.Fprintf(&b, "\n  %s published a want naming it since the check began (#%d): %s", plural(n, "node"), last, s)
	}
	for _, f := range starts {
		fmt.Fprintf(&b, "\n  fleet %s started a rollout giving it since the check began (#%d) ('meshfold rollout status %s')", f, last, f)
	}
	return b.String()
}
