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
	"github.com/meshfold/meshfold/reconcile/audit"
)

func init() { register(newBuildCmd) }

func newBuildCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Module bundles in the object store: push, ls, rm",
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
  BUILD=$(meshfold build push ./x) && echo "$BUILD"`,
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
	nc, err := a.conn.connect("meshfold-build", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
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
	nc, err := a.conn.connect("meshfold-build", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
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
	cmd := &cobra.Command{
		Use:   "rm BUILD",
		Short: "Delete a stored bundle",
		Long: `rm deletes the bundle stored under BUILD. Node agents that have fetched it keep
running it from their cache; a node that has not yet fetched it fails its apply
with a settle that says the bundle is missing.`,
		Example: `  meshfold build rm sha256:9f1c...`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBuildRm(cmd.Context(), a, args[0])
		},
	}
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

func runBuildRm(ctx context.Context, a *app, build string) error {
	if _, err := bundle.ParseBuild(build); err != nil {
		return withCode(exitUsage, err)
	}
	nc, err := a.conn.connect("meshfold-build", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	st := bundle.NewStore(js, a.stream.name)
	if err := st.Remove(ctx, build); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "meshfold: removed %s from %s\n", bundle.Short(build), st.Bucket())
	return nil
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
