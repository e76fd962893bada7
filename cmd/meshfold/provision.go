package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
)

func init() { register(newProvisionCmd) }

type provisionOpts struct {
	from    string
	account string
	timeout time.Duration
	resync  time.Duration
	trust   trustFlag
}

func newProvisionCmd(a *app) *cobra.Command {
	var o provisionOpts
	cmd := &cobra.Command{
		Use:   "provision NAME --from DIR --account ACCOUNT",
		Short: "Run a provisioner client: fill node NAME's declared files on start, on every knock and as plans declare them",
		Long: `provision fills the files node NAME's newest plan declares, from a source
directory, through the node agent's fill endpoint (<prefix>.NAME.fill). The
content of module M's file /P is read from DIR/M/P; a missing source is
logged by path and skipped.

It fills everything once on start, again on every knock the reconciler
publishes for NAME (knocks that arrive together are coalesced) and every
--resync. When NAME settles a plan that declares files the last pass did not
fill, or files whose last write was refused, it fills those at once. Requests
that get no answer (no node agent yet, a timeout) are retried with jittered
exponential backoff up to 10 s apart; a write the node made before its reply
was lost is reported filled, not unchanged. A refused write is logged and
sent again at the next knock or settle that may accept it.

--account is the account this client runs as: the node accepts writes only
from the settled plan's provisioner account. Content is never logged. Each
pass logs what it did: filled, unchanged (the file already held the
content), refused, missing (no source), failed.

It fills only from plans, and on knocks, that a trusted reconciler key
signed. On a machine where no meshfold serve ran, pass the reconciler's
trust file with --trust (an auth directory's reconcilers.pub, copied to the
node). It exits with status 1 when its NATS connection is closed for good
(its user revoked).`,
		Example: `  meshfold provision ace --from /srv/secrets/ace --account prov
  # with /srv/secrets/ace/mesh-build-go/run/mesh-build-go/broker.creds
  # holding the content of mesh-build-go's /run/mesh-build-go/broker.creds
  meshfold provision ace --from /srv/secrets/ace --account prov -s tls://hub.example:4222 \
    --tls-ca ca.pem --creds provisioner-ace.creds --trust reconcilers.pub`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeNodes(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runProvision(cmd, a, args[0], o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.from, "from", "", "source directory: DIR/<module>/<path> holds each file's content (required)")
	fl.StringVar(&o.account, "account", "", "the account this client runs as, sent as the writer (required)")
	fl.DurationVar(&o.timeout, "timeout", provision.DefaultTimeout, "how long one fill request waits for its reply")
	fl.DurationVar(&o.resync, "resync", provision.DefaultResync, "fill everything again this often (a missing source added later, a file deleted on the node); 0 turns it off")
	o.trust.add(cmd)
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.MarkFlagRequired("account")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

func runProvision(cmd *cobra.Command, a *app, name string, o provisionOpts) error {
	if !events.ValidName(name) {
		return withCode(exitUsage, &events.FieldError{Field: "NAME", Value: name, Err: events.ErrBadName})
	}
	if o.timeout <= 0 {
		return withCode(exitUsage, fmt.Errorf("--timeout %s: must be positive", o.timeout))
	}
	// The same rule as a want's runs_as: an account the want cannot name
	// would never be the plan's provisioner account.
	if !events.ValidAccount(o.account) {
		return withCode(exitUsage, &events.FieldError{Field: "--account", Value: o.account, Err: events.ErrBadAccount})
	}
	log, err := a.logger()
	if err != nil {
		return err
	}
	trust, err := o.trust.load()
	if err != nil {
		return err
	}
	nc, err := a.conn.connectWait(cmd.Context(), "meshfold-provision-"+name, a)
	if err != nil {
		return err
	}
	defer nc.Close()
	// A connection closed for good (a revoked user) ends the client with
	// an error: it would never reconnect, and its service manager brings
	// it back.
	return store.WhileConnected(cmd.Context(), nc, func(ctx context.Context) error {
		return runProvisioner(ctx, a, name, o, nc, trust, log)
	})
}

// runProvisioner runs the provisioner client of node name on nc until
// ctx is done.
func runProvisioner(ctx context.Context, a *app, name string, o provisionOpts, nc *nats.Conn, trust *store.Trust, log *slog.Logger) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, scfg, err := a.stream.openStreamWait(ctx, js, log)
	if err != nil {
		return err
	}
	c, err := provision.New(nc, js, provision.Config{Node: name, From: o.from, Account: o.account,
		Logger: log, Stream: scfg, Timeout: o.timeout, Resync: resyncOrOff(o.resync), Trust: trust})
	if err != nil {
		return withCode(exitUsage, err)
	}
	return c.Run(ctx)
}

// resyncOrOff maps the flag's 0 ("off") to the library's negative.
func resyncOrOff(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
