package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

func init() { register(newProvisionCmd) }

type provisionOpts struct {
	from        []string
	key         string
	newKey      bool
	execTimeout time.Duration
	retry       time.Duration
	account     string
	timeout     time.Duration
	resync      time.Duration
	trust       trustFlag
}

func newProvisionCmd(a *app) *cobra.Command {
	var o provisionOpts
	cmd := &cobra.Command{
		Use:   "provision NAME --from DIR|exec:CMD|sealed... --account ACCOUNT",
		Short: "Run a provisioner client: fill node NAME's declared files on start, on every knock and as plans declare them",
		Long: `provision fills the files node NAME's newest plan declares, from its sources,
through the node agent's fill endpoint (<prefix>.NAME.fill). --from may be
given several times; the sources are tried in that order and the first with
content wins:

  --from DIR        module M's file /P is read from DIR/M/P
  --from exec:CMD   the helper 'sh -c "CMD \"\$@\"" sh NAME M /P' is run, with
                    MESHFOLD_NODE, MESHFOLD_MODULE and MESHFOLD_PATH in its
                    environment (as git's credential helpers): exit 0 with
                    output is the content; exit 104 (and only it) says it has
                    nothing for the file (no source: the next is asked); past
                    --exec-timeout it is killed. Any other non-zero exit (a
                    backend that is down), exit 0 with no output, a helper
                    that times out, cannot start or prints more than 1 MiB
                    failed: the sources after it are not consulted for the
                    file (it may hold newer content), which is not written
                    (source-failed). Its stdout
                    is never logged, the first line of its stderr is (at
                    warn once while it stays the same for the file).
  --from sealed     the sealed secret 'meshfold secret put' stored for NAME,
                    opened with this provisioner's curve key (--key, created
                    0600 on the first start and registered so that 'secret
                    put' seals to it; a --key file that does not exist while
                    NAME has a registered key is refused, exit 2, unless
                    --new-key: a mistyped path would re-key the node). A put is filled at once: the client
                    watches NAME's secrets. A secret that is stored but
                    removed ('secret rm'), sealed to another key (the key
                    changed) or that cannot be opened stops the sources
                    after sealed: the file is not written ('secret rm
                    --next-source' hands the file on to them). A source
                    before sealed that has the file wins: a put of other
                    content is then reported shadowed.

Each --from is checked at start, before connecting: a DIR that is missing
or not a directory ("did you mean sealed?" of a slip of it), or an exec:CMD
whose first word is not found ($PATH, or the path given) or not executable,
is refused with exit 2. A first word the shell reads (an assignment, a
quote, an expansion, a builtin) is left to sh.

A file no source gives is skipped; why (no source, a helper that failed, a
secret sealed to another key or that cannot be opened) is kept in the
<stream>_FILLS bucket, shown by 'meshfold fleet' and 'state', and cleared once
the file is filled.

It fills everything once on start, again on every knock the reconciler
publishes for NAME (knocks that arrive together are coalesced) and every
--resync. When NAME settles a plan that declares files the last pass did not
fill, or files whose last write was refused, it fills those at once. Requests
that get no answer (no node agent yet, a timeout) are retried with jittered
exponential backoff up to 10 s apart; a write the node made before its reply
was lost is reported filled, not unchanged. A refused write is logged and
sent again at the next knock or settle that may accept it.

One client speaks for a node: it holds the node's provisioner lease (the key
NAME.provisioner of the <stream>_NODES bucket, renewed every TTL/4, 5 s TTL by
default) while it runs, and a second client of NAME is refused (exit 1,
naming the holder's host, pid and since). The reconciler records the lease's
claim and its end in the stream (a prov event: up; down as released, or as
expired when the client died, kill -9 included, within two TTLs). While no
provisioner of NAME is up and NAME's plan declares a file, 'meshfold fleet'
and the console flag NAME provisioner-down, and 'fleet' and 'state' say
"no provisioner answered since T", how its lease ended and that the fill
statuses shown are as it last saw them. Start one again: it fills every
file on start and answers the knocks that waited, no poke needed. A client
whose credentials do not reach its lease (issued by an older 'meshfold auth')
says so at error level and fills without it. Credentials that may not do
what it does on start (another node's provisioner's: it runs as user
provisioner-NAME) end it at once, exit 1, naming the user they are of.

--account is the account this client runs as: the node accepts writes only
from the settled plan's provisioner account. Content is never logged. Each
pass logs what it did: filled, unchanged (the file already held the
content), refused, missing (no source), failed.

It fills only from plans, and on knocks, signed by a key it was given,
and says at start which keys and from where: --trust-from DIR, DIR the
--data (or --auth) directory of the meshfold serve beside it, or --trust
FILE (an auth directory's reconcilers.pub, copied to the node). It exits
with status 1 when its NATS connection is closed for good (its user
revoked).`,
		Example: `  meshfold provision ace --from /srv/secrets/ace --account prov --trust-from meshfold-data
  # is ace's provisioner alive? (prov up/down in its history; NEEDS provisioner-down in fleet)
  meshfold state ace | grep prov
  meshfold fleet
  meshfold provision ace --from sealed --from 'exec:/usr/local/bin/vault-fill' --account prov --trust-from meshfold-data
  # rotate ace's curve key: remove the key file, start once with --new-key, put every secret again
  meshfold provision ace --from sealed --key /var/lib/meshfold/provisioner-ace/curve.key --new-key --account prov --trust-from meshfold-data
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
	fl.StringArrayVar(&o.from, "from", nil, "a source, tried in the order given: DIR, exec:CMD or sealed (required; repeatable)")
	fl.StringVar(&o.key, "key", "", "the curve key file of --from sealed (default: provisioner-NAME/curve.key beside the node agent's default state directory, e.g. /var/lib/meshfold/provisioner-NAME/curve.key as root: one per machine and NAME, shared by every mesh this machine runs a provisioner NAME for; give --key to keep meshes apart)")
	fl.BoolVar(&o.newKey, "new-key", false, "create a new curve key when the --key file does not exist although NAME has a registered one, and register it over it (a rotation: every secret put for NAME must then be put again); without it that is refused (exit 2), since a mistyped --key would do the same")
	fl.DurationVar(&o.execTimeout, "exec-timeout", provision.DefaultExecTimeout, "how long one run of an exec: helper may take")
	fl.DurationVar(&o.retry, "retry-unfilled", provision.DefaultRetryUnfilled, "try the files no source gave again this often (a restored source is filled within it); 0 turns it off")
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
	if o.execTimeout <= 0 {
		return withCode(exitUsage, fmt.Errorf("--exec-timeout %s: must be positive", o.execTimeout))
	}
	for _, f := range o.from {
		if err := checkFrom(f); err != nil {
			return withCode(exitUsage, err)
		}
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
	trust, trustPath, err := o.trust.load()
	if err != nil {
		return err
	}
	sayTrust(a, "provisioner "+name, trust, trustPath)
	nc, err := a.conn.connectWait(cmd.Context(), "meshfold-provision-"+name, a)
	if err != nil {
		return err
	}
	defer nc.Close()
	// A permission the creds lack while the client starts (the curve key
	// read, the knocks read) ends it at once, explained (exit 1), as the
	// node agent's: the creds of another node's provisioner are no
	// transient failure, and were retried for ever (a fresh user's
	// finding M1 of fresh10). Once started, a violation is logged as
	// before.
	started := make(chan struct{})
	own := auth.UserName(auth.RoleProvisioner, name)
	a.watchDeniedUntil(nc, started)
	a.deniedNeeds = fmt.Sprintf("'meshfold provision %s' runs as the provisioner role, user %s ('meshfold auth add-node %s' writes its creds file)",
		name, own, name)
	if user, _ := credsUser(a.conn.withEnv().creds); user == "" || user == own {
		// The node's own provisioner creds, issued before provisioners
		// held a lease, fill without it (provision.Client.Run says so).
		leases := a.stream.config().WithDefaults().Name + store.NodeLeaseBucketSuffix
		a.deniedSpared = func(subject string) bool {
			return strings.HasPrefix(subject, "$KV."+leases+".") || strings.HasSuffix(subject, ".KV_"+leases) || strings.Contains(subject, ".KV_"+leases+".")
		}
	}
	// A connection closed for good (a revoked user) ends the client with
	// an error: it would never reconnect, and its service manager brings
	// it back.
	err = store.WhileConnected(cmd.Context(), nc, func(ctx context.Context) error {
		return runProvisioner(ctx, a, name, o, nc, trust, log, started)
	})
	if d := a.deniedErr(); d != nil {
		return d // ended by the violation, which run explains
	}
	return err
}

// runProvisioner runs the provisioner client of node name on nc until
// ctx is done, closing started once the client has started
// (provision.Client.Ready).
func runProvisioner(ctx context.Context, a *app, name string, o provisionOpts, nc *nats.Conn, trust *store.Trust, log *slog.Logger, started chan<- struct{}) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, scfg, err := a.stream.openStreamWait(ctx, js, log)
	if err != nil {
		return err
	}
	var sources []provision.Source
	for _, f := range o.from {
		switch {
		case f == "sealed":
			src, err := sealedSource(ctx, js, scfg, name, o.key, o.newKey, log)
			if err != nil {
				return err
			}
			sources = append(sources, src)
		case strings.HasPrefix(f, "exec:"):
			sources = append(sources, &provision.Exec{Command: strings.TrimPrefix(f, "exec:"), Timeout: o.execTimeout, Log: log})
		default:
			if fi, err := os.Stat(f); err != nil {
				return withCode(exitUsage, fmt.Errorf("--from: %w", err))
			} else if !fi.IsDir() {
				return withCode(exitUsage, fmt.Errorf("--from %s: not a directory (nor exec:CMD, nor sealed)", f))
			}
			sources = append(sources, provision.Dir(f))
		}
	}
	status, err := store.OpenFillStatus(ctx, js, scfg, true)
	if err != nil {
		log.Warn("fill status bucket not opened: fleet and state will not show why a file is unfilled", "err", err)
		status = nil
	}
	tp, stopTracing, err := a.startTracing(ctx, "meshfold-provision", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	c, err := provision.New(nc, js, provision.Config{Node: name, Sources: sources, Account: o.account, Status: status,
		Logger: log, Stream: scfg, Timeout: o.timeout, Resync: resyncOrOff(o.resync), RetryUnfilled: resyncOrOff(o.retry), Trust: trust, Tracing: tp,
		Lease: true})
	if err != nil {
		return withCode(exitUsage, err)
	}
	go func() {
		select {
		case <-c.Ready():
			close(started)
		case <-ctx.Done():
		}
	}()
	return c.Run(ctx)
}

// resyncOrOff maps the flag's 0 ("off") to the library's negative.
func resyncOrOff(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// sealedSource opens the sealed secrets bucket (waiting for the reconciler
// to create it) and the provisioner's curve key.
func sealedSource(ctx context.Context, js jetstream.JetStream, scfg store.StreamConfig, name, keyFile string, newKey bool, log *slog.Logger) (*provision.Sealed, error) {
	defaulted := keyFile == ""
	if keyFile == "" {
		dir, err := defaultStateDir(name)
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("--key: %w", err))
		}
		keyFile = filepath.Join(filepath.Dir(dir), "provisioner-"+name, "curve.key")
	}
	kv, err := store.Retry(ctx, log, "open the sealed secrets bucket", store.Backoff(200*time.Millisecond, 5*time.Second), func() (jetstream.KeyValue, error) {
		kv, err := store.OpenSecrets(ctx, js, scfg, true)
		if errors.Is(err, store.ErrPermissionDenied) {
			// Creds that may not open the bucket stay so: said now
			// (run explains the denial), not retried for ever.
			return nil, backoff.Permanent(err)
		}
		return kv, err
	})
	if err != nil {
		return nil, err
	}
	_, statErr := os.Lstat(keyFile) // as LoadCurveKey: it creates a file that does not exist
	missing := errors.Is(statErr, fs.ErrNotExist)
	switch {
	case missing && !newKey:
		// A mistyped --key would create a new key and register it over
		// the node's: every secret put for it would then be sealed to a
		// key nobody has (a fresh user's finding U34).
		reg, err := store.Retry(ctx, log, "read the registered curve key", store.Backoff(200*time.Millisecond, 5*time.Second), func() (registered, error) {
			pub, at, err := provision.RegisteredKey(ctx, kv, name)
			return registered{pub, at}, err
		})
		if err != nil {
			return nil, err
		}
		if reg.pub != "" {
			return nil, withCode(exitUsage, fmt.Errorf("--key %s: the key file does not exist, and %s has a registered curve key (%s, registered at %s): is the path right? "+
				"To rotate the key (every secret put for %s must then be put again), start once with --new-key",
				keyFile, name, reg.pub, reg.at.UTC().Format(time.RFC3339), name))
		}
	case !missing && newKey:
		log.Warn("--new-key: the key file exists and is used; --new-key only lets a missing key file be created over a registered key: remove it from the unit once rotated", "key", keyFile)
	}
	key, err := provision.LoadCurveKey(keyFile)
	if errors.Is(err, provision.ErrNotCurveSeed) {
		return nil, withCode(exitUsage, fmt.Errorf("%w: restore the key file from a backup, or, to rotate the key (every secret put for %s must then be put again), remove it and start with --new-key", err, name))
	}
	if err != nil {
		return nil, err
	}
	// Where the key is, so that a provisioner of the same NAME for
	// another mesh on this machine is seen to share it (the default is
	// one per machine and NAME; a fresh user's finding L13).
	log.Info("sealed secrets: curve key file", "key", keyFile, "created", missing, "default", defaulted)
	s, err := provision.NewSealed(kv, key)
	if err != nil {
		return nil, err
	}
	s.Rotation = missing && newKey // registering over the old key is the point
	return s, nil
}

// checkFrom refuses, at start, a --from that cannot work: empty; an
// exec:CMD whose first word is not found or not executable (it started
// and logged nothing until a file was declared, then source-failed: a
// fresh user's finding U15); a DIR that is missing or no directory, with
// "did you mean sealed?" for a slip of sealed.
func checkFrom(f string) error {
	switch {
	case f == "" || f == "exec:":
		return fmt.Errorf("--from %q: a directory, exec:CMD or sealed", f)
	case f == "sealed":
		return nil
	case strings.HasPrefix(f, "exec:"):
		return checkExecHelper(strings.TrimPrefix(f, "exec:"))
	}
	fi, err := os.Stat(f)
	if err != nil {
		return fmt.Errorf("--from: %w%s", err, didYouMean(f, []string{"sealed"}))
	}
	if !fi.IsDir() {
		return fmt.Errorf("--from %s: not a directory (nor exec:CMD, nor sealed)%s", f, didYouMean(f, []string{"sealed"}))
	}
	return nil
}

// checkExecHelper checks the first word of an exec: source's command: a
// path (it holds a slash) names a regular file with an execute bit; a
// name is found in $PATH. A command whose first word is shell syntax
// (an assignment, quotes, an expansion) or a shell builtin is left to
// the shell: sh -c runs it.
func checkExecHelper(command string) error {
	fields := strings.Fields(command)
	if len(fields) == 0 {
		return fmt.Errorf("--from exec:%s: no command", command)
	}
	first := fields[0]
	if strings.ContainsAny(first, "='\"$`(){};|&<>*?~\\") || slices.Contains(shellBuiltins, first) {
		return nil
	}
	if !strings.Contains(first, "/") {
		if _, err := exec.LookPath(first); err != nil {
			return fmt.Errorf("--from exec:%s: %s is not found in $PATH: give the helper's full path", command, first)
		}
		return nil
	}
	fi, err := os.Stat(first)
	switch {
	case err != nil:
		return fmt.Errorf("--from exec:%s: the helper %s: %w", command, first, err)
	case fi.IsDir() || !fi.Mode().IsRegular():
		return fmt.Errorf("--from exec:%s: the helper %s is not a file", command, first)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("--from exec:%s: the helper %s is not executable (mode %04o): chmod +x it", command, first, fi.Mode().Perm())
	}
	return nil
}

// shellBuiltins are the first words checkExecHelper leaves to sh.
var shellBuiltins = []string{".", ":", "[", "cd", "command", "echo", "eval", "exec", "export", "false", "printf", "read", "set", "source", "test", "true", "umask", "unset"}

// registered is a node's registered curve key and when it was put.
type registered struct {
	pub string
	at  time.Time
}
