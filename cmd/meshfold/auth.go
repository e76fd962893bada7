package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/embedded"
)

func init() { register(newAuthCmd) }

func newAuthCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Issue and revoke least-privilege NATS credentials for every role",
		Example: `  meshfold auth init --dir ./mesh-auth
  meshfold auth add-node ace --dir ./mesh-auth
  meshfold serve --auth ./mesh-auth --data ./data
  meshfold fleet --creds ./mesh-auth/creds/operator.creds
  meshfold auth add-operator alice --dir ./mesh-auth   # alice's own creds: the audit names her, checked by the server
  meshfold auth revoke node-ace --dir ./mesh-auth --no-push   # files only: a server started later refuses it`,
		Long: `auth manages an auth directory: a NATS operator, a system account, the mesh
account (JetStream enabled, within limits) and one user per role, each with a
creds file holding only the permissions its role needs (decentralized JWT
auth, as nsc makes it). The directory is the mesh's root of trust: keep it on
an administrator's machine; hand each role only its creds file.

  meshfold auth init --dir ./mesh-auth
      the operator, the accounts, and the users reconciler, controller,
      operator, operator-read (the web console's) and sys
  meshfold auth add-node ace --dir ./mesh-auth
      node-ace and provisioner-ace
  meshfold auth add-operator alice --dir ./mesh-auth
      operator-alice: an operator of one's own, whose approvals and
      operator events the server lets name alice only; revoked alone;
      the first one makes the stream store named operators' events, once
      every reconciler runs a build that folds them
  meshfold auth enable-named --dir ./mesh-auth
      that stream step alone (a stream made later, or --no-stream)
  meshfold serve --auth ./mesh-auth
      the embedded server in operator mode; its rollout controller
      publishes wants as the controller user
  meshfold node ace --creds ./mesh-auth/creds/node-ace.creds --trust ./mesh-auth/reconcilers.pub ...
      a role connects with its own creds file
  meshfold auth revoke node-ace --dir ./mesh-auth
      refused at once, no restart; a revoked node agent exits with status 1
  meshfold auth add-user operator-read --dir ./mesh-auth
      a user issued again after its revocation, or one an older directory lacks

Each user subscribes only to its own inbox, _INBOX_<user>; meshfold's commands
find that prefix in the creds file. For the nats CLI, save it in the context
(nats context save ace --creds ... --inbox-prefix _INBOX_node-ace).
See docs/operations.md for the policy and for external servers and clusters.`,
	}
	cmd.AddCommand(newAuthInitCmd(a), newAuthAddNodeCmd(a), newAuthAddUserCmd(a), newAuthAddOperatorCmd(a), newAuthEnableNamedCmd(a), newAuthRevokeCmd(a), newAuthRotateReconcilerCmd(a))
	return cmd
}

func newAuthInitCmd(a *app) *cobra.Command {
	var (
		dir    string
		force  bool
		limits auth.Limits
	)
	cmd := &cobra.Command{
		Use:   "init --dir DIR",
		Short: "Create an operator, the accounts and the users of every role but the nodes'",
		Long: `init creates DIR (mode 0700; missing parent directories are made with
mode 0755, as mkdir -p does) with a new operator, a system account (user
"sys", for pushing account updates), the mesh account with JetStream enabled,
and creds files for the users reconciler, controller, operator and
operator-read (the web console's: it reads what the operator reads and
publishes nothing). Seeds and creds are written with mode 0600.
DIR/resolver.conf configures an external nats-server with the same operator
and accounts.

init refuses a DIR that exists and is not empty. --force replaces an existing
auth directory (one init wrote): every credential issued from it stops
working.

The permissions are written for the stream and prefix given (--stream,
--prefix); a mesh with another stream name or prefix needs its own directory.`,
		Example: `  meshfold auth init --dir ./mesh-auth
  meshfold auth init --dir /etc/meshfold/auth --max-disk 50000000000`,
		Args: noArgs(""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := auth.Init(dir, auth.Config{Names: auth.Names{Stream: a.stream.name, Prefix: a.stream.prefix},
				Limits: limits, Force: force})
			if errors.Is(err, auth.ErrExists) {
				return withCode(exitUsage, err)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "auth directory %s: operator %s, mesh account %s (stream %s, prefix %q)\n",
				d.Path(), d.Operator(), d.Account(), d.Names().Stream, d.Names().Prefix)
			printUsers(a, d, d.Users())
			fmt.Fprintf(a.stdout, "next: meshfold auth add-node NAME --dir %s; meshfold serve --auth %s\n", dir, dir)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&dir, "dir", "", "the auth directory to create (required)")
	fl.BoolVar(&force, "force", false, "replace an existing auth directory")
	fl.Int64Var(&limits.DiskStorage, "max-disk", auth.DefaultLimits.DiskStorage, "the mesh account's JetStream file storage, bytes (-1: unlimited)")
	fl.Int64Var(&limits.MemoryStorage, "max-memory", auth.DefaultLimits.MemoryStorage, "the mesh account's JetStream memory storage, bytes (-1: unlimited)")
	fl.Int64Var(&limits.Streams, "max-streams", auth.DefaultLimits.Streams, "the mesh account's stream count (meshfold uses 2)")
	fl.Int64Var(&limits.Consumers, "max-consumers", auth.DefaultLimits.Consumers, "the mesh account's consumer count (-1: unlimited)")
	_ = cmd.MarkFlagRequired("dir")
	a.stream.add(cmd)
	return cmd
}

func newAuthAddNodeCmd(a *app) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "add-node NAME... --dir DIR",
		Short: "Issue the node-NAME and provisioner-NAME users of one or more nodes",
		Long: `add-node issues two users for each node NAME and writes their creds files:

  node-NAME         publishes only NAME's have, settle, refusal and filled;
                    reads only NAME's plan; serves NAME's fill subject
  provisioner-NAME  sends fill requests to NAME only; follows only NAME's
                    knocks and settles; reads only NAME's plan and NAME's
                    sealed secrets; registers NAME's curve key; reports why
                    NAME's files are unfilled

Nothing changes on the servers: users are signed by the mesh account and
accepted as soon as they connect. Copy DIR/` + trustFileName + ` to the node
too (add-node prints its path): its agent and provisioner trust exactly the
plans and knocks signed by the keys it names (--trust FILE). A user that
exists is refused unless it was revoked (then it is issued again with a new
key). Several names are issued in one call, DIR/resolver.conf and
DIR/auth.json written once: every name is checked first, and one that is
invalid, repeated, or whose two users both exist refuses the call with
nothing issued (300 nodes: meshfold auth add-node $(seq -f 'n%03g' 1 300)
--dir DIR).`,
		Example: `  meshfold auth add-node ace --dir ./mesh-auth
  meshfold auth add-node n001 n002 n003 --dir ./mesh-auth`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, name := range args {
				if !events.ValidName(name) {
					return withCode(exitUsage, &events.FieldError{Field: "NAME", Value: name, Err: events.ErrBadName})
				}
			}
			d, err := auth.Open(dir)
			if err != nil {
				return withCode(exitUsage, err)
			}
			users, err := d.AddNodes(args...)
			if errors.Is(err, auth.ErrUserExists) || errors.Is(err, events.ErrInvalid) {
				return withCode(exitUsage, err)
			}
			if err != nil {
				return err
			}
			printUsers(a, d, users)
			fmt.Fprintf(a.stdout, "  %-22s %s   (copy to the node: node and provision --trust FILE)\n", "trusted reconcilers", d.TrustPath())
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the auth directory (required)")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

func newAuthAddUserCmd(a *app) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "add-user ROLE --dir DIR",
		Short: "Issue the user of a role that has one: reconciler, controller, operator, operator-read",
		Long: `add-user issues the user of ROLE and writes its creds file: for a directory
made before the role existed (operator-read, the web console's user, came
after the others), or to issue again a user that was revoked, with a new key.
A user that exists and is not revoked is refused.

  operator-read   reads the stream, the snapshot bucket and the state
                  service; publishes nothing, never sees a fill subject
                  (meshfold console --creds DIR/creds/operator-read.creds)`,
		Example: `  meshfold auth add-user operator-read --dir ./mesh-auth`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := auth.Open(dir)
			if err != nil {
				return withCode(exitUsage, err)
			}
			u, err := d.AddUser(auth.Role(args[0]))
			if errors.Is(err, auth.ErrUserExists) || errors.Is(err, auth.ErrUnknownRole) {
				return withCode(exitUsage, err)
			}
			if err != nil {
				return err
			}
			printUsers(a, d, []auth.User{u})
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the auth directory (required)")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

func newAuthAddOperatorCmd(a *app) *cobra.Command {
	var (
		dir      string
		noStream bool
		f        namedStreamFlags
	)
	cmd := &cobra.Command{
		Use:   "add-operator NAME --dir DIR",
		Short: "Issue operator-NAME: one person's operator user, whose events the server lets name NAME only",
		Long: `add-operator issues the user operator-NAME and writes its creds file: an
operator of one's own, for one person. It may do all the shared operator user
does, except that it publishes approvals, operator events (pause, resume,
poke, revoke, waive, retire) and acks only on subjects that end in NAME
(<partition>.mesh.<node>.<kind>.NAME), never on the shared operator's. The
server checks that against the creds' JWT, and the reconciler and the audit
take the "by" of such an event from its subject: the audit names the person
whose creds acted, not whom the caller said.

With these creds --by defaults to NAME, and another name is refused.
Revoking one person (meshfold auth revoke operator-NAME) leaves every other
operator's creds working. Rollout verbs and secret puts keep a self-declared
--by (docs/operations.md, "Named operators").

NAME is a node-style name ([a-z0-9][a-z0-9_-]{0,62}); "read" is refused
(operator-read is the console's user). A user that exists is refused unless it
was revoked (then it is issued again with a new key).

The stream stores named operators' events only once asked: after issuing the
creds, add-operator makes it store them, as auth enable-named does (connected
as DIR/creds/reconciler.creds to --server): once, for the first named
operator. A reconciler of a build before named operators refuses to start on
such a stream, so upgrade every reconciler first; add-operator asks the
reconcilers' state services for their build (as operator-NAME) and leaves the
stream as it is when one answered from an older build, or none answered
(exit 1; --force changes it anyway). With --no-stream only the files change.`,
		Example: `  meshfold auth add-operator alice --dir ./mesh-auth
  NATS_CREDS=./mesh-auth/creds/operator-alice.creds meshfold approve ace nats img:nats-2.10.24   # by alice
  meshfold auth add-operator bob --dir ./mesh-auth --no-stream   # files only (no server at hand)
  meshfold auth revoke operator-alice --dir ./mesh-auth   # alice alone`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := auth.Open(dir)
			if err != nil {
				return withCode(exitUsage, err)
			}
			if f.wait <= 0 {
				return withCode(exitUsage, fmt.Errorf("--wait %s: must be more than 0", f.wait))
			}
			if !noStream {
				if err := a.checkNamedConn(d); err != nil {
					return err
				}
			}
			u, err := d.AddOperator(args[0])
			if errors.Is(err, auth.ErrUserExists) || errors.Is(err, auth.ErrReservedName) || errors.Is(err, events.ErrInvalid) {
				return withCode(exitUsage, err)
			}
			if err != nil {
				return err
			}
			printUsers(a, d, []auth.User{u})
			if noStream {
				fmt.Fprintf(a.stdout, "the stream was not asked (--no-stream): %s's operator events are refused until it stores named operators' events (meshfold auth enable-named --dir %s)\n",
					u.Operator, d.Path())
				return nil
			}
			if err := a.enableNamed(cmd.Context(), d, d.CredsPath(u.Name), f); err != nil {
				return fmt.Errorf("%s issued, but %w; then: meshfold auth enable-named --dir %s", u.Name, err, d.Path())
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the auth directory (required)")
	cmd.Flags().BoolVar(&noStream, "no-stream", false, "only issue the creds; leave the stream as it is")
	f.add(cmd)
	a.conn.add(cmd)
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

func newAuthRevokeCmd(a *app) *cobra.Command {
	var (
		dir    string
		noPush bool
		wait   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "revoke USER --dir DIR",
		Short: "Revoke a user and push the account update to the running server",
		Long: `revoke revokes USER (node-ace, provisioner-ace, operator-alice, ...) in the mesh
account's JWT, rewrites DIR/resolver.conf, and pushes the new account JWT to
the server (--server, default nats://127.0.0.1:4222) as the system user
(DIR/creds/sys.creds unless --creds says otherwise): the server closes the
user's connections and refuses it from then on, without a restart. Every
server of the cluster answers the push; revoke prints each one's answer
(waiting up to --wait) and exits with status 1 when a server it knows of
(one answering a ping, or a peer of the JetStream meta leader) did not
apply it: one that is down refuses the user within its resolver interval
(10 s) after it restarts, or at once if DIR/resolver.conf is copied to it
first.

A long-running command connected as the user (node, provision, reconcile, or
serve --auth when USER is reconciler) exits with status 1, "NATS connection
closed for good", so that its service manager restarts it, with the new
credentials once issued.

With --no-push only the files change: a server started later (meshfold serve
--auth DIR, or one whose resolver.conf is the new one) refuses the user.
A revoked user is issued again with a new key: a node's with auth add-node
NAME, a named operator's with auth add-operator NAME, any other with auth
add-user ROLE.`,
		Example: `  meshfold auth revoke node-ace --dir ./mesh-auth
  meshfold auth revoke operator-alice --dir ./mesh-auth   # one person's operator; the others' creds keep working
  meshfold auth revoke operator-read --dir ./mesh-auth --no-push   # files only; servers started later refuse it
  meshfold auth revoke node-ace --dir ./mesh-auth --server tls://nats.example:4222 --tls-ca ca.pem`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := auth.Open(dir)
			if err != nil {
				return withCode(exitUsage, err)
			}
			conn := a.conn
			if conn.creds == "" && conn.nkey == "" && conn.context == "" {
				conn.creds = d.CredsPath(auth.SystemUser)
			}
			if !noPush {
				// A creds or TLS file that is missing or malformed is
				// refused before anything is revoked (exit 2), not after.
				cfg, err := conn.config("meshfold-auth-revoke", a)
				if err != nil {
					return err
				}
				if _, err := cfg.Options(); err != nil {
					return fmt.Errorf("nothing revoked: %w", err)
				}
			}
			if err := d.Revoke(args[0]); errors.Is(err, auth.ErrUnknownUser) || errors.Is(err, auth.ErrSystemUser) {
				return withCode(exitUsage, err)
			} else if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "revoked %s in %s\n", args[0], filepath.Join(d.Path(), "accounts", auth.MeshAccountName+".jwt"))
			if noPush {
				fmt.Fprintln(a.stdout, "not pushed (--no-push): running servers still accept it until they load the new account JWT")
				return nil
			}
			nc, err := conn.connect("meshfold-auth-revoke", a)
			if err != nil {
				return fmt.Errorf("revoked in %s, but not pushed: %w", d.Path(), err)
			}
			defer nc.Close()
			if wait <= 0 {
				return withCode(exitUsage, fmt.Errorf("--wait %s: must be more than 0", wait))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			rep, err := d.Push(ctx, nc)
			if err != nil {
				return fmt.Errorf("revoked in %s, but the push failed: %w", d.Path(), err)
			}
			return printPush(a, d, args[0], rep)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the auth directory (required)")
	cmd.Flags().BoolVar(&noPush, "no-push", false, "only update the files; push nothing")
	cmd.Flags().DurationVar(&wait, "wait", 3*time.Second, "how long to wait for every server of the cluster to answer the push")
	_ = cmd.MarkFlagRequired("dir")
	a.conn.add(cmd)
	return cmd
}

func newAuthRotateReconcilerCmd(a *app) *cobra.Command {
	var (
		dir     string
		finish  bool
		overlap time.Duration
	)
	cmd := &cobra.Command{
		Use:   "rotate-reconciler --dir DIR",
		Short: "Replace the key that signs plans and knocks, with an overlap where both keys verify",
		Long: `rotate-reconciler replaces the reconciler's signing key
(DIR/` + signingKeyFile + `). The old public key is kept in
DIR/` + retiredKeysFile + ` (the reconciler still takes its older plans for
its own), and DIR/` + trustFileName + ` then names the new key and the old
one, retired until --overlap from now: the overlap. During it an agent
applies plans signed by either key, but never one of the old key after one
of the new key (a plan of the retired key is never newer than the current
key's); once it ends, the agents refuse the old key even if their trust
file still names it. In this order:

  1. meshfold auth rotate-reconciler --dir DIR
  2. copy DIR/` + trustFileName + ` to every node; restart its agent and provisioner
     (they now accept plans and knocks signed by either key)
  3. restart every reconciler (partitioned ones with the same new seed)
  4. meshfold auth rotate-reconciler --dir DIR --finish, and copy the trust
     file again: only the new key verifies from then on

DIR may also be the --data directory of a meshfold serve without --auth,
which keeps the same three files: step 2 is then restarting the agents and
provisioners (--trust-from DIR reads DIR/` + trustFileName + ` at their
start; copy it where a node has --trust FILE), step 3 restarting serve.
Never move the seed away instead: serve then makes a new key with no
retired one, and its older plans are no longer its own.`,
		Example: `  meshfold auth rotate-reconciler --dir ./mesh-auth
  meshfold auth rotate-reconciler --dir ./mesh-auth --overlap 72h
  meshfold auth rotate-reconciler --dir ./mesh-auth --finish
  meshfold auth rotate-reconciler --dir ./meshfold-data`,
		Args: noArgs(""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if overlap <= 0 {
				return withCode(exitUsage, fmt.Errorf("--overlap %s: must be more than 0", overlap))
			}
			seedPath, trustPath := filepath.Join(dir, signingKeyFile), filepath.Join(dir, trustFileName)
			var keys []string
			var until time.Time
			d, err := auth.Open(dir)
			switch {
			case err == nil:
				keys, until, err = d.RotateReconciler(finish, overlap)
			case !errors.Is(err, auth.ErrNotAuthDir):
				return withCode(exitUsage, err)
			default:
				if _, serr := os.Stat(seedPath); serr != nil {
					return withCode(exitUsage, fmt.Errorf("--dir %s: neither an auth directory (no auth.json: meshfold auth init makes one) nor the --data directory of a meshfold serve (no %s)", dir, signingKeyFile))
				}
				// A serve's data directory: the same files, the same
				// overlap (a fresh user's finding U12).
				keys, until, err = auth.RotateKeys(dir, finish, overlap)
				if err == nil && !finish {
					fmt.Fprintf(a.stdout, "new signing key %s in %s\n%s trusts it and the previous %s until %s: restart the node agents and provisioners (--trust-from %s reads it at their start; copy it where a node has --trust FILE), then serve; then --finish\n",
						keys[0], seedPath, trustPath, keys[1], until.Format(time.RFC3339), dir)
					return nil
				}
			}
			if err != nil {
				return err
			}
			if finish {
				fmt.Fprintf(a.stdout, "overlap ended: %s trusts only %s\n", trustPath, keys[0])
				return nil
			}
			fmt.Fprintf(a.stdout, "new signing key %s in %s\n%s trusts it and the previous %s until %s: copy it to every node, restart the agents and provisioners, then the reconcilers; then --finish\n",
				keys[0], seedPath, trustPath, keys[1], until.Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the auth directory, or the --data directory of a serve without --auth (required)")
	cmd.Flags().BoolVar(&finish, "finish", false, "end the overlap: trust only the current key")
	cmd.Flags().DurationVar(&overlap, "overlap", 24*time.Hour, "how long agents with the new trust file still accept the old key's plans and knocks")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

// printPush prints each server's answer to the push of user's
// revocation, one line each, and returns an error (exit 1) when a server
// did not apply it.
func printPush(a *app, d *auth.Dir, user string, rep auth.PushReport) error {
	var missed []string
	many := len(rep.Servers)+rep.Unnamed > 1
	if many {
		fmt.Fprintf(a.stdout, "pushed to %d servers:\n", len(rep.Servers)+rep.Unnamed)
	} else {
		fmt.Fprint(a.stdout, "pushed to ")
	}
	for _, s := range rep.Servers {
		if many {
			fmt.Fprint(a.stdout, "  ")
		}
		switch {
		case s.Err == nil:
			fmt.Fprintf(a.stdout, "%s: %s\n", s.Server, s.Message)
			continue
		case errors.Is(s.Err, auth.ErrNoAnswer):
			fmt.Fprintf(a.stdout, "%s: no answer (offline? once it restarts it refuses %s within its resolver interval, 10 s; or copy %s to it)\n",
				s.Server, user, filepath.Join(d.Path(), "resolver.conf"))
		case errors.Is(s.Err, auth.ErrPushSkipped):
			fmt.Fprintf(a.stdout, "%s: skipped: it has not loaded the account (a MEMORY resolver: copy %s to it and reload it)\n",
				s.Server, filepath.Join(d.Path(), "resolver.conf"))
		default:
			fmt.Fprintf(a.stdout, "%s: refused: %v\n", s.Server, s.Err)
		}
		missed = append(missed, s.Server)
	}
	if rep.Unnamed > 0 {
		fmt.Fprintf(a.stdout, "  %d more of the JetStream cluster's %d servers: no answer, and no meta leader to name them (down? each refuses %s within its resolver interval, 10 s, after its restart; or copy %s to it)\n",
			rep.Unnamed, len(rep.Servers)+rep.Unnamed, user, filepath.Join(d.Path(), "resolver.conf"))
		missed = append(missed, fmt.Sprintf("%d unnamed", rep.Unnamed))
	}
	if len(missed) > 0 {
		return fmt.Errorf("revoked in %s, but %d of %d servers did not apply it: %s (see above)",
			d.Path(), len(missed)+max(0, rep.Unnamed-1), len(rep.Servers)+rep.Unnamed, strings.Join(missed, ", "))
	}
	return nil
}

func printUsers(a *app, d *auth.Dir, users []auth.User) {
	for _, u := range users {
		fmt.Fprintf(a.stdout, "  %-22s %s\n", u.Name, d.CredsPath(u.Name))
	}
}

// serveAuthFlags are serve's authentication and TLS flags.
type serveAuthFlags struct {
	dir                  string
	tlsCert, tlsKey, tca string
}

func (f *serveAuthFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "auth", "", "run in operator mode with the accounts and users of this auth directory (meshfold auth init); the reconciler connects as its reconciler user, the rollout controller as its controller user (rollouts are off when the directory has none)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "server certificate (PEM): clients must then connect with TLS")
	fl.StringVar(&f.tlsKey, "tls-key", "", "the server certificate's key (PEM)")
	fl.StringVar(&f.tca, "tls-client-ca", "", "CA (PEM) whose client certificates are required (mutual TLS)")
}

// apply sets cfg's Auth and TLS fields and returns the options of the
// reconciler's in-process connection. It checks that the stream flags
// match the directory's names, or adopts them when the flags were not
// given.
func (f *serveAuthFlags) apply(cmd *cobra.Command, a *app, cfg *embedded.Config) ([]nats.Option, error) {
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA = f.tlsCert, f.tlsKey, f.tca
	if f.dir == "" {
		return nil, nil
	}
	d, err := auth.Open(f.dir)
	if err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--auth: %w", err))
	}
	names := d.Names()
	for _, fl := range []struct {
		flag, dirs string
		val        *string
	}{{"stream", names.Stream, &a.stream.name}, {"prefix", names.Prefix, &a.stream.prefix}} {
		if !cmd.Flags().Changed(fl.flag) {
			*fl.val = fl.dirs
		} else if *fl.val != fl.dirs {
			return nil, withCode(exitUsage, fmt.Errorf("--%s %q: the auth directory's permissions are written for %q", fl.flag, *fl.val, fl.dirs))
		}
	}
	if cfg.Auth, err = d.ServerAuth(); err != nil {
		return nil, err
	}
	creds := d.CredsPath(string(auth.RoleReconciler))
	inbox, err := store.CredsInboxPrefix(creds)
	if err != nil {
		return nil, err
	}
	return []nats.Option{nats.UserCredentials(creds), nats.CustomInboxPrefix(inbox)}, nil
}

// controllerOptions returns the options of the rollout controller's
// in-process connection under --auth: the directory's controller user,
// which may publish the rollouts' wants (the reconciler's may not). When
// the directory has no usable controller user, opts is nil and off says
// why rollouts are off. Without --auth both are empty: the controller
// runs on the reconciler's connection.
func (f *serveAuthFlags) controllerOptions() (opts []nats.Option, off string, err error) {
	if f.dir == "" {
		return nil, "", nil
	}
	d, err := auth.Open(f.dir)
	if err != nil {
		return nil, "", withCode(exitUsage, fmt.Errorf("--auth: %w", err))
	}
	user := string(auth.RoleController)
	fix := fmt.Sprintf("issue it with 'meshfold auth add-user %s --dir %s' and restart serve", user, f.dir)
	u, err := d.User(user)
	switch {
	case errors.Is(err, auth.ErrUnknownUser):
		return nil, fmt.Sprintf("the auth directory %s has no %s user, which publishes the rollouts' wants; %s", f.dir, user, fix), nil
	case err != nil:
		return nil, "", err
	case u.Revoked != nil:
		return nil, fmt.Sprintf("the %s user of %s, which publishes the rollouts' wants, is revoked; %s", user, f.dir, fix), nil
	}
	creds := d.CredsPath(user)
	inbox, err := store.CredsInboxPrefix(creds)
	if err != nil {
		return nil, fmt.Sprintf("the %s user's creds: %v; %s", user, err, fix), nil
	}
	return []nats.Option{nats.UserCredentials(creds), nats.CustomInboxPrefix(inbox), nats.Name("meshfold serve rollouts")}, "", nil
}
