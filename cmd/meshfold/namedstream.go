package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// namedStreamFlags are the flags of the step that makes the stream store
// named operators' events (auth add-operator, auth enable-named).
type namedStreamFlags struct {
	force bool
	wait  time.Duration
}

func (f *namedStreamFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.force, "force", false, "add the stream's named subjects even when a reconciler of an older build answered, or none did")
	cmd.Flags().DurationVar(&f.wait, "wait", 2*time.Second, "how long to wait for the reconcilers' state services to say their build")
}

func newAuthEnableNamedCmd(a *app) *cobra.Command {
	var (
		dir string
		f   namedStreamFlags
	)
	cmd := &cobra.Command{
		Use:   "enable-named --dir DIR",
		Short: "Make the stream store named operators' events (after every reconciler is upgraded)",
		Long: `enable-named makes the event stream store the events of named operators
(auth add-operator NAME), on <partition>.<prefix>.<node>.<kind>.NAME, and
their rollout verbs, on <prefix>.rollout.<fleet>.<verb>.NAME: it adds one
subject, <p>.<prefix>.*.*.*, per partition and <prefix>.rollout.*.*.* to the
stream, once. Until then a named operator's pause, approval, rollout pause,
... is refused ("the stream does not store named operators' events yet"). A
stream an older build took this step on lacks the rollout verbs' subject:
run it again once every reconciler is upgraded. auth add-operator does the
same step; this verb is for a stream made after the operator was issued, or
after add-operator --no-stream.

A reconciler of a build before named operators refuses to start on a stream
with these subjects, and folds none of the named events. So: upgrade every
reconciler (meshfold serve/reconcile) first, then run this. Before changing
the stream it asks every reconciler's state service for its build
($SRV.INFO.meshfold, as DIR/creds/operator.creds, waiting --wait) and changes
nothing when one answered from an older build, or none answered (--force
changes it anyway). Node agents and provisioners of an older build open the
stream as before.

It connects as the reconciler (DIR/creds/reconciler.creds unless --creds,
--nkey or --context says otherwise): only the reconciler may update the
stream. Running it again changes nothing.`,
		Example: `  meshfold auth enable-named --dir ./mesh-auth
  meshfold auth enable-named --dir ./mesh-auth --server tls://nats.example:4222 --tls-ca ca.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := auth.Open(dir)
			if err != nil {
				return withCode(exitUsage, err)
			}
			return a.enableNamed(cmd.Context(), d, d.CredsPath(string(auth.RoleOperator)), f)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the auth directory (required)")
	_ = cmd.MarkFlagRequired("dir")
	f.add(cmd)
	a.conn.add(cmd)
	return cmd
}

// enableNamed makes the stream of d's names store the named operators'
// events (store.CaptureNamed), connected as the reconciler, once every
// reconciler that answers its state service's discovery (asked with the
// creds askAs) says it folds them; see enable-named's help.
func (a *app) enableNamed(ctx context.Context, d *auth.Dir, askAs string, f namedStreamFlags) error {
	if f.wait <= 0 {
		return withCode(exitUsage, fmt.Errorf("--wait %s: must be more than 0", f.wait))
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+f.wait)
	defer cancel()
	upd, own := a.namedConn(d)
	nc, err := upd.connect("meshfold-auth-enable-named", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	names := d.Names()
	scfg := store.StreamConfig{Name: names.Stream, Prefix: names.Prefix}
	stream, eff, err := store.OpenStreamRiding(ctx, js, scfg)
	if errors.Is(err, store.ErrNoStream) {
		return fmt.Errorf("%w; once a reconciler made it: meshfold auth enable-named --dir %s", err, d.Path())
	}
	if err != nil {
		return err
	}
	if store.CapturesNamed(stream, scfg) && store.CapturesNamedRollouts(stream, scfg) {
		fmt.Fprintf(a.stdout, "the stream %s stores named operators' events already\n", eff.Name)
		return nil
	}
	// A stream whose step a build before named rollout verbs took
	// captures the partitions' patterns and not the rollouts' one, which
	// that build's reconciler refuses: it is added only once every
	// reconciler says it folds them too.
	rollouts := !store.CapturesNamedRollouts(stream, scfg)

	ask := a.conn
	if !own {
		ask.creds = askAs
	}
	infos, err := askReconcilers(ctx, &ask, a, eff.Prefix, f.wait)
	older := 0
	for _, in := range infos {
		what := "folds named operators' events and rollout verbs"
		switch {
		case in.Metadata[events.MetaNamedOperators] == "":
			what, older = "an older build: folds no named operator's event, refuses a stream that stores them", older+1
		case rollouts && in.Metadata[events.MetaNamedRollouts] == "":
			what, older = "an older build: folds no named operator's rollout verb, refuses a stream that stores them", older+1
		}
		fmt.Fprintf(a.stdout, "  reconciler %s (state service %s): %s\n", in.ID, in.Version, what)
	}
	switch {
	case f.force:
	case err != nil:
		return fmt.Errorf("the stream was not changed: the reconcilers could not be asked for their build: %w (--force changes it anyway)", err)
	case len(infos) == 0:
		return fmt.Errorf("the stream was not changed: no reconciler's state service answered within %s, so none could say it folds named operators' events "+
			"(start the reconcilers, or give --wait more; --force changes it anyway)", f.wait)
	case older > 0:
		return fmt.Errorf("the stream was not changed: %d of %d reconcilers run an older build (above); upgrade every reconciler first "+
			"(docs/operations.md, \"Named operators\"; --force changes it anyway)", older, len(infos))
	}
	added, err := store.CaptureNamed(ctx, js, scfg)
	if err != nil {
		return fmt.Errorf("the stream was not changed: %w", err)
	}
	if len(added) > 0 {
		fmt.Fprintf(a.stdout, "the stream %s now stores named operators' events and rollout verbs: added %s (%s)\n", eff.Name, plural(len(added), "subject"), spanOf(added))
		fmt.Fprintln(a.stdout, "a reconciler of a build before this one refuses this stream from now on: upgrade before restarting any (docs/operations.md, \"Named operators\")")
	}
	return nil
}

// namedConn returns the connection flags the stream step updates the
// stream with: the command's, or, when they name no credential (--creds,
// --nkey, --context), the reconciler's creds of d; own says which.
func (a *app) namedConn(d *auth.Dir) (c connFlags, own bool) {
	c = a.conn
	if own = c.creds != "" || c.nkey != "" || c.context != ""; !own {
		c.creds = d.CredsPath(string(auth.RoleReconciler))
	}
	return c, own
}

// checkNamedConn checks the stream step's credential and TLS files
// before anything is issued: a missing or malformed one is the command
// line's fault (exit 2), as for every command that takes --creds.
func (a *app) checkNamedConn(d *auth.Dir) error {
	c, _ := a.namedConn(d)
	cfg, err := c.config("meshfold-auth-enable-named", a)
	if err != nil {
		return err
	}
	if _, err := cfg.Options(); err != nil {
		return fmt.Errorf("nothing issued: %w", err)
	}
	return nil
}

// spanOf is "a … z" of a list of more than two, else the list joined.
func spanOf(s []string) string {
	if len(s) > 2 {
		return s[0] + " … " + s[len(s)-1]
	}
	return strings.Join(s, ", ")
}

// askReconcilers asks every micro service named as the reconcilers'
// state service (events.StateServiceName) for its info, connected with
// conn, and returns the answers of those of prefix that came within
// wait. The connection is dialled without app.watchDenied: a credential
// that may not ask is an error here, not the command's end.
func askReconcilers(ctx context.Context, conn *connFlags, a *app, prefix string, wait time.Duration) ([]micro.Info, error) {
	nc, err := conn.dial("meshfold-auth-ask", a)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	denied := make(chan error, 1)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			select {
			case denied <- err:
			default:
			}
		}
	})
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$SRV.INFO."+events.StateServiceName, inbox, nil); err != nil {
		return nil, err
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return nil, err
	}
	var infos []micro.Info
	deadline := time.Now().Add(wait)
	for {
		m, err := sub.NextMsg(time.Until(deadline))
		if errors.Is(err, nats.ErrTimeout) {
			select {
			case err := <-denied: // no answer came: the ask was refused
				return infos, err
			default:
				return infos, nil
			}
		}
		if errors.Is(err, nats.ErrNoResponders) {
			return infos, nil // the server's word: no service subscribed
		}
		if err != nil {
			return infos, err
		}
		var in micro.Info
		if json.Unmarshal(m.Data, &in) != nil || in.Name != events.StateServiceName {
			continue
		}
		if p := in.Metadata["prefix"]; p != "" && p != prefix {
			continue // another mesh's, on the same account
		}
		infos = append(infos, in)
	}
}
