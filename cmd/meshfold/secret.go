package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

func init() { register(newSecretCmd) }

func newSecretCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Sealed per-node secrets for 'provision --from sealed': put, ls, rm",
		Example: `  meshfold secret put ace mesh-build-go /run/mesh-build-go/broker.creds -f broker.creds --by alice
  meshfold secret ls ace
  meshfold provision ace --from sealed --account prov --trust-from ./data   # on ace: fills it
  meshfold secret rm ace mesh-build-go /run/mesh-build-go/broker.creds --by alice`,
		Long: `secret manages sealed secrets (DESIGN.md §12). A secret is the content of one
filled file (node, module, path), sealed to that node's provisioner curve key
(X25519 with XSalsa20-Poly1305, as nkeys' xkeys) and stored as ciphertext
only in the KV bucket <stream>_SECRETS, with history. Only the node's
provisioner can open it; 'meshfold provision NODE --from sealed' registers
its public key on its first start and fills a put at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withCode(exitUsage, errors.New("secret needs a subcommand: put, ls or rm (see meshfold secret --help)"))
		},
	}
	cmd.AddCommand(newSecretPutCmd(a), newSecretLsCmd(a), newSecretRmCmd(a))
	return cmd
}

// secretArgs checks NODE MODULE PATH.
func secretArgs(args []string) error {
	if !events.ValidName(args[0]) {
		return withCode(exitUsage, &events.FieldError{Field: "NODE", Value: args[0], Err: events.ErrBadName})
	}
	if !events.ValidName(args[1]) {
		return withCode(exitUsage, &events.FieldError{Field: "MODULE", Value: args[1], Err: events.ErrBadName})
	}
	if !events.ValidPath(args[2]) {
		return withCode(exitUsage, &events.FieldError{Field: "PATH", Value: args[2], Err: events.ErrBadPath})
	}
	return nil
}

// openSecrets connects and opens the secrets bucket (creating it when
// create). The caller closes the connection (close).
func (a *app) openSecrets(ctx context.Context, create bool) (jetstream.KeyValue, func(), error) {
	kv, _, closeConn, err := a.openSecretsFills(ctx, create)
	return kv, closeConn, err
}

// openSecretsFills is openSecrets that also returns the fill status
// bucket (nil when it cannot be opened: no provisioner ran yet, or the
// credentials may not read it), where a provisioner says a sealed secret
// is shadowed by an earlier source.
func (a *app) openSecretsFills(ctx context.Context, create bool) (jetstream.KeyValue, jetstream.KeyValue, func(), error) {
	sc, err := a.openSecretsConn(ctx, create)
	if err != nil {
		return nil, nil, nil, err
	}
	return sc.kv, sc.fills, sc.nc.Close, nil
}

// secretsConn is what a secret verb opens: the connection (the caller
// closes it), the stream's config, the secrets bucket and the fill
// status bucket (nil when it cannot be opened).
type secretsConn struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	scfg  store.StreamConfig
	kv    jetstream.KeyValue
	fills jetstream.KeyValue
}

func (a *app) openSecretsConn(ctx context.Context, create bool) (*secretsConn, error) {
	nc, err := a.conn.connect("meshfold-secret", a)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	_, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		nc.Close()
		return nil, err
	}
	kv, err := store.OpenSecrets(ctx, js, scfg, create)
	if err != nil {
		nc.Close()
		return nil, err
	}
	fills, err := store.OpenFillStatus(ctx, js, scfg, false)
	if err != nil {
		fills = nil
	}
	return &secretsConn{nc: nc, js: js, scfg: scfg, kv: kv, fills: fills}, nil
}

// shadowedBy returns, of node's fill statuses in fills ("" for every
// node's; fills nil: none), the files whose sealed secret the provisioner
// reports shadowed by an earlier source, keyed by [store.SecretKey], each
// with the source ("dir /srv/x"). Best effort: a status that cannot be
// read is left out.
func shadowedBy(ctx context.Context, fills jetstream.KeyValue, node string) map[string]string {
	out := map[string]string{}
	if fills == nil {
		return out
	}
	sts, _ := store.ReadFillStatus(ctx, fills, node)
	for _, st := range sts {
		if st.State != store.FillShadowed {
			continue
		}
		src := st.Source
		if src == "" { // a provisioner older than FillStatus.Source
			src = "an earlier source"
		}
		out[store.SecretKey(st.Node, st.Module, st.Path)] = src
	}
	return out
}

func newSecretPutCmd(a *app) *cobra.Command {
	var file, by string
	var timeout, wait time.Duration
	var ahead bool
	cmd := &cobra.Command{
		Use:   "put NODE MODULE PATH [-f FILE] --by NAME [--ahead]",
		Short: "Seal a file's content to NODE's provisioner and store it",
		Long: `put reads the content (from -f FILE, else from stdin), seals it to NODE's
provisioner curve key, and stores the ciphertext under NODE, MODULE and PATH.
NODE's provisioner ('provision NODE --from sealed') fills it at once; a
provisioner that is down fills it on its start, an agent that is down gets
it when it is back (a note on stderr says which is down, and since when).
Content equal to what the node holds is not written again, and triggers no
on_fill.

NODE's provisioner must have started once with --from sealed (it registers
its key then); one started with only --from DIR or exec:CMD takes its files
from there and registers no key, and put refuses (exit 1). After its key
changed (a new node, a lost key file), put every secret of NODE again:
'secret ls NODE' marks the ones sealed to an old key.
Prints the revision and the digest (an HMAC under a key kept in the bucket,
never a plain hash); the content is never printed. The revision is the
secrets bucket's sequence, as 'secret ls' shows it, shared by every secret
and key registration: a note on stderr says so and which put of this file
it is. A refused put stores nothing and moves no revision.

A file that NODE's newest want does not declare for MODULE (a mistyped
module or path; or a node with no want yet) is refused: exit 2, nothing
stored, and the message names what the want declares ("did you mean …?"
when one is close). To store a secret ahead of the want that will declare
it, give --ahead: it is filled once a want declares it, and a note says so.

Then put waits, at most --wait (default 2s; 0: not at all), for what
NODE's provisioner did with this put, and prints it on stdout:
"filled on NODE (digest …)" (the node holds the put: written, or it held
that content already), or "not filled yet: <why>": the provisioner's fill
status at this put (refused, and why: e.g. wrong-account; shadowed;
sealed-to-other-key …), no provisioner up, or one that refuses NODE's
plans for their signer (a --trust without the reconciler's key: the key
and what to do; no wait for either), or, when nothing
came within the wait, what is known: a provisioner whose lease was not
renewed for more than half its TTL (it may be down: killed, its lease not
expired yet), the agent down, a refusal the node holds owed. A file NODE
held before says "last filled on the node at …" (gone if the node was
rebooted or re-imaged since). The exit
code is 0 either way: the put is stored, and is filled when the cause
goes. With a provisioner and an agent up, a put returns as soon as the
fill is reported (30 to 251 ms in all over 10 puts, median 126 ms, the same
as with --wait 0, measured on 2 cores at load average 49).

When NODE's provisioner reports this
file shadowed (it fills it from a source given before --from sealed, which
holds other content: the node keeps that content), put warns; 'secret ls'
and 'state' say so too.

The content must fit, sealed, in one message of the server's max_payload
(the connection reports it), and so must the fill request that carries it
to the node: sealing adds a few dozen bytes and the stored record carries
the ciphertext in base64 (4 bytes for 3), so a 1 MiB server holds a secret
of at most about 786,100 bytes (786,113 for ace mesh-build-go
/run/mesh-build-go/broker.creds --by you, measured; a few bytes less for
longer names). Content above it is refused before anything is stored,
exit 2, saying the ceiling: "content is 900000 bytes; a sealed secret holds
at most 786113 bytes on this server (max_payload 1 MiB)".

` + byUncheckedHelp,
		Example: `  meshfold secret put ace mesh-build-go /run/mesh-build-go/broker.creds -f broker.creds --by alice
  vault kv get -field=token kv/ace/mbg | meshfold secret put ace mesh-build-go /run/mbg/token --by alice
  meshfold secret put ace web /run/web/tls.key -f tls.key --by alice --ahead   # before the want naming it`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := secretArgs(args); err != nil {
				return err
			}
			if by == "" || events.HasControl(by) || len(by) > events.MaxText {
				return withCode(exitUsage, fmt.Errorf("--by %s: one line naming who puts it", events.Short(by)))
			}
			var r io.Reader = a.stdin
			if file != "" {
				f, err := os.Open(file)
				if err != nil {
					return withCode(exitUsage, err)
				}
				defer f.Close()
				r = f
			}
			content, err := io.ReadAll(io.LimitReader(r, provision.MaxContent+1))
			if err != nil {
				return err
			}
			if len(content) > provision.MaxContent {
				return withCode(exitUsage, fmt.Errorf("content above %d bytes", provision.MaxContent))
			}
			if len(content) == 0 {
				return withCode(exitUsage, errors.New("empty content: nothing to seal (an empty file is no source)"))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			sc, err := a.openSecretsConn(ctx, true)
			if err != nil {
				return err
			}
			defer sc.nc.Close()
			check := func() error {
				if ahead {
					return nil
				}
				return a.refuseUndeclaredPut(ctx, args[0], args[1], args[2])
			}
			rev, digest, err := putSecret(ctx, sc.kv, args[0], args[1], args[2], content, by, check, sc.nc.MaxPayload())
			if errors.Is(err, store.ErrNoCurveKey) {
				return a.unknownSecretNode(ctx, args[0], err)
			}
			if err != nil {
				return err
			}
			undeclared := ""
			if ahead {
				if undeclared = a.undeclaredNote(ctx, args[0], args[1], args[2]); undeclared != "" {
					fmt.Fprintf(a.stderr, "note: %s\n", undeclared)
				}
			}
			view, viewed := a.nodeView(ctx, args[0])
			if viewed {
				fmt.Fprint(a.stderr, putDownNote(args[0], view, time.Now()))
			}
			if _, err = fmt.Fprintf(a.stdout, "%s %s %s revision %d digest %s\n", args[0], args[1], args[2], rev, digest[:16]); err != nil {
				return err
			}
			fmt.Fprintln(a.stderr, putCountNote(ctx, sc.kv, args[0], args[1], args[2], rev))
			shadowed, isShadowed := "", false
			if wait > 0 && undeclared == "" {
				// The put is stored (exit 0 whatever follows); say
				// whether the node got it (a fresh user's finding U7).
				wctx, wcancel := context.WithTimeout(cmd.Context(), wait+10*time.Second)
				o := a.awaitFill(wctx, sc, fillWait{node: args[0], module: args[1], path: args[2], rev: rev, digest: digest, wait: wait,
					view: view, viewed: viewed})
				wcancel()
				shadowed, isShadowed = o.shadowedBy, o.shadowedBy != ""
				if _, err := fmt.Fprintln(a.stdout, o.line); err != nil {
					return err
				}
			} else {
				shadowed, isShadowed = shadowedBy(ctx, sc.fills, args[0])[store.SecretKey(args[0], args[1], args[2])]
			}
			if isShadowed {
				fmt.Fprintf(a.stderr, "meshfold: warning: %s's provisioner reports this file shadowed: it fills it from %s, given before --from sealed, "+
					"so the node holds that source's content, not a put, while the source has the file ('meshfold state %s' says so; "+
					"give --from sealed first, or remove the file from that source)\n",
					args[0], events.Text(shadowed), args[0])
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "read the content from FILE (default: stdin)")
	cmd.Flags().StringVar(&by, "by", "", "who puts it (required, but a named operator's creds give their name); kept beside the ciphertext")
	cmd.Flags().BoolVar(&ahead, "ahead", false, aheadFlagHelp("store the secret"))
	cmd.Flags().DurationVar(&wait, "wait", 2*time.Second, "how long to wait for NODE's provisioner to fill the put, to say whether the node got it (0: do not wait)")
	addPublishTimeout(cmd, &timeout)
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error { return a.settleByFor(cmd, &by, secretUnchecked) }
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// putSecret seals content to node's registered key and stores it; it
// returns the revision and the digest. check, when not nil, runs once the
// key is found and before anything is written: its error refuses the put.
//
// maxPayload is the server's max_payload as the connection reports it (0:
// unknown): a content whose sealed record, or the fill request that
// carries it to the node, would not fit is refused (exit 2, nothing
// stored), saying the ceiling (a fresh user's finding U23: the raw
// "nats: maximum payload exceeded", exit 1, above about 790 KB of a 1 MiB
// server).
func putSecret(ctx context.Context, kv jetstream.KeyValue, node, module, path string, content []byte, by string, check func() error, maxPayload int64) (uint64, string, error) {
	e, err := kv.Get(ctx, store.CurveKeyName(node))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, "", &noKeyError{node: node}
	}
	if err != nil {
		return 0, "", err
	}
	if key := string(e.Value()); !nkeys.IsValidPublicCurveKey(key) {
		// A stray put of the key (another tool's value): name the node,
		// the key and the fix, not only the value (a fresh user's finding
		// V5: 'store: "{\"v\":1}" is not a curve public key').
		if len(key) > 64 {
			key = key[:64] + "…"
		}
		return 0, "", fmt.Errorf("node %s's registered curve key (key %s of bucket %s) holds %q, which is no curve public key (written by another tool?); nothing was stored: "+
			"restart node %s's provisioner ('meshfold provision %s --from sealed …'), which registers its key again at start, then put again",
			node, store.CurveKeyName(node), kv.Bucket(), key, node, node)
	}
	if check != nil {
		if err := check(); err != nil {
			return 0, "", err
		}
	}
	dkey, err := digestKey(ctx, kv)
	if err != nil {
		return 0, "", err
	}
	rec, err := store.SealSecret(node, module, path, content, string(e.Value()), dkey, by, time.Now())
	if err != nil {
		return 0, "", err
	}
	if maxPayload > 0 {
		if ceiling := sealedCeiling(rec, len(content), module, path, maxPayload); len(content) > ceiling {
			return 0, "", withCode(exitUsage, fmt.Errorf("content is %d bytes; a sealed secret holds at most %d bytes on this server (max_payload %s): "+
				"nothing stored (sealing and its base64 encoding take about a quarter of the message)", len(content), ceiling, sizeText(maxPayload)))
		}
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, "", err
	}
	rev, err := kv.Put(ctx, store.SecretKey(node, module, path), data)
	return rev, rec.Digest, err
}

// sealedCeiling is the most content bytes a secret sealed as rec (from
// n bytes) holds on a server of max_payload maxPayload: its stored record
// must fit (store.SealedSecret.MaxContentIn), and so must the fill
// request that carries the content to the node, beside its headers
// (events.FillRequestRoom).
func sealedCeiling(rec store.SealedSecret, n int, module, path string, maxPayload int64) int {
	return max(0, min(rec.MaxContentIn(n, maxPayload), int(maxPayload)-events.FillRequestRoom(module, path)))
}

// sizeText is n bytes as a person reads a server limit: "1 MiB" for a
// whole number of MiB or KiB, else bytes.
func sizeText(n int64) string {
	switch {
	case n > 0 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n > 0 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// putCountNote says what a put's revision is: the secrets bucket's
// sequence (what 'secret ls' and 'nats kv history' show), shared by every
// key and registration, not a count of this file's puts, which it gives
// from the key's history (the bucket keeps store.SecretsHistory of them).
// A refused put stores nothing and moves no revision.
func putCountNote(ctx context.Context, kv jetstream.KeyValue, node, module, path string, rev uint64) string {
	note := fmt.Sprintf("note: revision %d is the secrets bucket's sequence (as 'secret ls' shows it, shared by every secret and key registration), not a count of this file's puts", rev)
	h, err := kv.History(ctx, store.SecretKey(node, module, path))
	if err != nil || len(h) == 0 {
		return note
	}
	n := 0
	for _, e := range h {
		if e.Operation() == jetstream.KeyValuePut {
			n++
		}
	}
	count := fmt.Sprintf("put %d", n)
	if len(h) >= store.SecretsHistory {
		count = fmt.Sprintf("put %d or later (the bucket keeps the last %d)", n, store.SecretsHistory)
	}
	return note + fmt.Sprintf(": this is %s of %s %s %s", count, node, module, events.Text(path))
}

// noKeyError is a put refused because no provisioner of node registered
// a curve key (store.ErrNoCurveKey): the node's provisioner reads no
// sealed secret, most often because it was started with --from DIR or
// exec:CMD alone (README's first form), which take files from there and
// register no key. It says so and what to do, not the store's words.
type noKeyError struct{ node string }

func (e *noKeyError) Error() string {
	return fmt.Sprintf("no provisioner of node %s reads sealed secrets: none has registered its key; nothing was stored. "+
		"A provisioner started with only --from DIR or exec:CMD takes its files from there and registers no key; "+
		"start %s's provisioner with --from sealed (beside the others, tried in order: 'meshfold provision %s --from sealed --from DIR --account ACCOUNT …'), "+
		"then put again (or keep the file in DIR, as DIR/<module>/<path>: no secret put needed)",
		e.node, e.node, e.node)
}

func (e *noKeyError) Unwrap() error { return store.ErrNoCurveKey }

// digestKey returns the bucket's digest HMAC key, creating it once.
func digestKey(ctx context.Context, kv jetstream.KeyValue) ([]byte, error) {
	for range 3 {
		e, err := kv.Get(ctx, store.DigestKeyName)
		if err == nil && len(e.Value()) == 32 {
			return e.Value(), nil
		}
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if _, err := kv.Create(ctx, store.DigestKeyName, key); err == nil {
			return key, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, err
		}
	}
	return nil, errors.New("secret: the digest key cannot be read")
}

// secretRow is one line of `secret ls`.
type secretRow struct {
	Node     string    `json:"node"`
	Module   string    `json:"module"`
	Path     string    `json:"path"`
	Revision uint64    `json:"revision"`
	Digest   string    `json:"digest"`
	By       string    `json:"by"`
	At       time.Time `json:"at"`
	// Current is false when the secret is sealed to another key than the
	// one the node's provisioner registered: put it again.
	Current bool `json:"current"`
	// Removed is a removal ('secret rm'): no content; By removed it, At.
	Removed bool `json:"removed,omitempty"`
	// ShadowedBy names the source the node's provisioner fills the file
	// from instead, tried before sealed ("dir /srv/x"), as its fill
	// status reports it: the put is not what the node holds.
	ShadowedBy string `json:"shadowed_by,omitempty"`
	// KeyChanged, of a secret sealed to another key than the registered
	// one, is when the node's registered curve key was written, if after
	// this put: a rotation, or a stolen provisioner credential's key (a
	// tester's finding G3). Check which before putting again: a put seals
	// to whatever key is registered.
	KeyChanged *time.Time `json:"key_changed,omitempty"`
}

func newSecretLsCmd(a *app) *cobra.Command {
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "ls [NODE]",
		Short: "List the stored secrets (digests and revisions, never content)",
		Long: `ls lists the sealed secrets, of NODE or of every node: node, module, path,
revision, digest (HMAC-SHA256 under the bucket's digest key, cut), who put it
and when, and whether it is sealed to the key NODE's provisioner registered
("old key": put it again; when the key was registered after the put, a note
says when it changed: unless the node's provisioner was restarted with a new
key file, check for a stolen provisioner credential first, since a put seals
to whatever key is registered); a removal ('secret rm') shows as removed,
with who removed it and when. A secret the node's provisioner reports
shadowed (it fills the file from a source given before --from sealed,
holding other content) says by which source. Never content. The last line
counts them ("-- 0 secrets of ace" for a node with none).`,
		Example: `  meshfold secret ls
  meshfold secret ls ace -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := out.get()
			if err != nil {
				return err
			}
			filter := ">"
			if len(args) == 1 {
				if !events.ValidName(args[0]) {
					return withCode(exitUsage, &events.FieldError{Field: "NODE", Value: args[0], Err: events.ErrBadName})
				}
				filter = args[0] + ".>"
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			kv, fills, closeConn, err := a.openSecretsFills(ctx, false)
			if err != nil {
				return err
			}
			defer closeConn()
			entries, err := store.ReadKV(ctx, kv, filter)
			if err != nil {
				return err
			}
			keys := map[string]string{}      // node → its registered curve key
			keysAt := map[string]time.Time{} // node → when it was registered
			for _, e := range entries {
				if node := firstToken(e.Key()); e.Key() == store.CurveKeyName(node) {
					keys[node], keysAt[node] = string(e.Value()), e.Created()
				}
			}
			node := ""
			if len(args) == 1 {
				node = args[0]
			}
			shadowed := shadowedBy(ctx, fills, node)
			var rows []secretRow
			for _, e := range entries {
				node, module, path, ok := store.ParseSecretKey(e.Key())
				if !ok {
					continue
				}
				rec, err := store.DecodeSealedSecret(e.Value())
				if err != nil {
					continue
				}
				row := secretRow{Node: node, Module: module, Path: path, Revision: e.Revision(),
					Digest: rec.Digest, By: rec.By, At: rec.At, Current: rec.To == keys[node], Removed: rec.Removed}
				if !rec.Removed { // a removal shadows nothing (a status not yet cleared)
					row.ShadowedBy = shadowed[e.Key()]
				}
				if at := keysAt[node]; !row.Current && !rec.Removed && at.After(rec.At) {
					row.KeyChanged = &at
				}
				rows = append(rows, row)
			}
			sort.Slice(rows, func(i, j int) bool {
				if rows[i].Node != rows[j].Node {
					return rows[i].Node < rows[j].Node
				}
				if rows[i].Module != rows[j].Module {
					return rows[i].Module < rows[j].Module
				}
				return rows[i].Path < rows[j].Path
			})
			if format != outTable {
				if rows == nil {
					rows = []secretRow{}
				}
				return writeValue(a.stdout, format, rows)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tMODULE\tPATH\tREV\tDIGEST\tBY\tAT\tKEY")
			var changed []string // nodes whose key changed after a put: see keyChangedNote
			for _, r := range rows {
				key := "current"
				switch {
				case r.Removed:
					key, r.Digest = "removed: no source fills it until a put", "-"
				case r.KeyChanged != nil:
					// The key was registered after this put: a rotation,
					// or a stolen provisioner credential's key (a
					// tester's finding G3: "put again" then re-sealed
					// every secret to the thief).
					key = "old key: the node's key changed since (see the note below)"
					if !slices.Contains(changed, r.Node) {
						changed = append(changed, r.Node)
					}
				case !r.Current:
					key = "old key: put again"
				}
				if r.ShadowedBy != "" {
					key += ", shadowed by " + events.Text(r.ShadowedBy) + " (tried first: the node holds its content)"
				}
				d := r.Digest
				if len(d) > 16 {
					d = d[:16]
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.Node, r.Module, events.Text(r.Path), r.Revision, d,
					events.Text(r.By), r.At.Format(time.RFC3339), key)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, n := range changed {
				fmt.Fprintln(a.stdout, keyChangedNote(n, keysAt[n]))
			}
			// The count, as every list says it (a fresh user's finding
			// U10: a node with none printed a bare header).
			_, err = fmt.Fprintln(a.stdout, secretsCount(rows, node))
			return err
		},
	}
	out.add(cmd, "")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// keyChangedNote is what `secret ls` says of node, whose registered curve
// key was written at at, after some of its secrets were sealed: before
// "put again", which seals to whatever key is registered now, the
// operator checks that the change was the node's own provisioner (a
// rotation, --new-key) and not a stolen provisioner credential (a
// tester's finding G3).
func keyChangedNote(node string, at time.Time) string {
	return fmt.Sprintf("note: %s's registered curve key changed at %s: if its provisioner did not restart with a new key file (--new-key), "+
		"check for a stolen provisioner credential before putting again (its log warns of a key registered over its own; 'meshfold auth revoke' the credential, restart the provisioner, then put)",
		node, at.UTC().Format(time.RFC3339))
}

// secretsCount is `secret ls`'s last line: how many secrets it listed
// (of node, "" for every node's), removals among them.
func secretsCount(rows []secretRow, node string) string {
	removed := 0
	for _, r := range rows {
		if r.Removed {
			removed++
		}
	}
	s := "-- " + plural(len(rows), "secret")
	if node != "" {
		s += " of " + node
	}
	if removed > 0 {
		s += fmt.Sprintf(" (%d removed)", removed)
	}
	return s
}

func firstToken(key string) string {
	for i := range len(key) {
		if key[i] == '.' {
			return key[:i]
		}
	}
	return key
}

func newSecretRmCmd(a *app) *cobra.Command {
	var by string
	var nextSource bool
	cmd := &cobra.Command{
		Use:   "rm NODE MODULE PATH --by NAME",
		Short: "Remove a stored secret (its history stays until it ages out)",
		Long: `rm removes NODE's secret for MODULE's PATH: it stores a removal in its place
(who, when; 'secret ls' shows it as removed). The file on the node is left as
it is, and the provisioner consults none of its sources after sealed for that
file (a directory, a helper: --from after --from sealed) until a new put: an
older content there must not come back on its own. 'meshfold fleet' and
'state' report the file as removed, with who removed it.

--next-source deletes the secret instead: the provisioner's next source fills
the file at once, when it has one for it (the module gets its on_fill action
if the content differs); without one, the file is left as it is and reported
as having no source.

` + byUncheckedHelp,
		Example: `  meshfold secret rm ace mesh-build-go /run/mesh-build-go/broker.creds --by alice
  meshfold secret rm ace mesh-build-go /run/mesh-build-go/broker.creds --by alice --next-source   # hand the file to the next --from`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := secretArgs(args); err != nil {
				return err
			}
			if by == "" || events.HasControl(by) || len(by) > events.MaxText {
				return withCode(exitUsage, fmt.Errorf("--by %s: one line naming who removes it", events.Short(by)))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			kv, closeConn, err := a.openSecrets(ctx, false)
			if err != nil {
				return err
			}
			defer closeConn()
			key := store.SecretKey(args[0], args[1], args[2])
			e, err := kv.Get(ctx, key)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("no secret for %s %s %s", args[0], args[1], events.Short(args[2]))
			} else if err != nil {
				return err
			}
			if rec, err := store.DecodeSealedSecret(e.Value()); err == nil && rec.Removed && !nextSource {
				return fmt.Errorf("no secret for %s %s %s: removed by %s at %s already", args[0], args[1], events.Short(args[2]),
					events.Text(rec.By), rec.At.Format(time.RFC3339))
			}
			if nextSource {
				if err := kv.Delete(ctx, key); err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.stdout, "removed %s %s %s: the provisioner's next source fills the file, if it has one\n", args[0], args[1], args[2])
				return err
			}
			data, err := json.Marshal(store.RemovedSecret(by, time.Now()))
			if err != nil {
				return err
			}
			if _, err := kv.Update(ctx, key, data, e.Revision()); err != nil {
				return fmt.Errorf("remove (did a put race it? 'meshfold secret ls %s' shows the newest): %w", args[0], err)
			}
			_, err = fmt.Fprintf(a.stdout, "removed %s %s %s: the file on the node is left as it is; no other source fills it until a new put (--next-source hands it on)\n", args[0], args[1], args[2])
			return err
		},
	}
	cmd.Flags().StringVar(&by, "by", "", "who removes it (required, but a named operator's creds give their name); kept in the removal")
	cmd.Flags().BoolVar(&nextSource, "next-source", false, "delete the secret: the provisioner's next source (--from after sealed) fills the file")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error { return a.settleByFor(cmd, &by, secretUnchecked) }
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// unknownSecretNode says, for a put refused because node registered no
// key (noKey, store.ErrNoCurveKey), whether the stream holds any event
// of node: none is a node the stream does not hold (a mistyped name,
// exit 2), said first, with how to start a new node's provisioner after;
// else noKey as it is (exit 1: the node is known, its provisioner has
// not started with --from sealed).
func (a *app) unknownSecretNode(ctx context.Context, node string, noKey error) error {
	nc, err := a.conn.connect("meshfold-secret", a)
	if err != nil {
		return noKey
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return noKey
	}
	if c, err := r.Count(ctx, node); err != nil || c > 0 {
		return noKey
	}
	cfg, _ := r.Stream(ctx)
	return withCode(exitUsage, fmt.Errorf("node %s is unknown: stream %s holds no event of it and no provisioner of it registered a key; nothing was stored "+
		"(is the name mistyped? 'meshfold fleet' lists the nodes; for a new node, start 'meshfold provision %s --from sealed' once, then put again, with --ahead before its first want)",
		node, cfg.Name, node))
}

// nodeView reads node's view (as the reconciler's fold of node says:
// reconcile.View), for [putDownNote] and what a put waits for; ok is
// false when it cannot be read (a note, not a refusal).
func (a *app) nodeView(ctx context.Context, node string) (reconcile.View, bool) {
	nc, err := a.conn.connect("meshfold-secret", a)
	if err != nil {
		return reconcile.View{}, false
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{Timeout: 2 * time.Second})
	if err != nil {
		return reconcile.View{}, false
	}
	ns, err := r.State(ctx, node)
	if err != nil {
		return reconcile.View{}, false
	}
	return ns.View, true
}

// putDownNote says, when node's agent or its provisioner is known down
// in its view v, since when and that the put is filled once it is back:
// the put itself succeeds, and said nothing (a fresh user's finding
// L10). A line each, ages told against now; "" when both are up or not
// known.
func putDownNote(node string, v reconcile.View, now time.Time) string {
	var b strings.Builder
	if v.AgentDown() {
		ag := v.Agent
		how := strings.TrimPrefix(audit.AgentSummary(&events.Agent{State: events.AgentDown, Why: ag.Why, Host: ag.Host, PID: ag.PID}), "DOWN: ")
		fmt.Fprintf(&b, "note: node %s's agent is down since %s (%s ago, #%d): %s; the secret is stored, and the file is filled when the agent is back "+
			"(its provisioner retries, at most 10 s apart)\n", node, audit.FormatTime(ag.Time), audit.Age(now.Sub(ag.Time)), ag.Seq, how)
	}
	if p := v.ProvisionerDown(); p != nil {
		how := strings.TrimPrefix(audit.ProvSummary(&events.Prov{Agent: events.Agent{State: events.AgentDown, Why: p.Why, Host: p.Host, PID: p.PID}}), "DOWN: ")
		fmt.Fprintf(&b, "note: no provisioner of %s is up since %s (%s ago, #%d): %s; the secret is stored, and the file is filled when "+
			"'meshfold provision %s …' runs again (it fills everything on start)\n", node, audit.FormatTime(p.Time), audit.Age(now.Sub(p.Time)), p.Seq, how, node)
	}
	return b.String()
}

// undeclaredNote says, of a secret stored with --ahead, why it is not
// filled now: no want of node declares path for module (the provisioner
// fills only declared files, DESIGN.md §4). "" when it is declared, or
// when the want cannot be read (the put itself succeeded).
func (a *app) undeclaredNote(ctx context.Context, node, module, path string) string {
	nc, js, err := a.connectJS("meshfold-secret")
	if err != nil {
		return ""
	}
	defer nc.Close()
	stream, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return ""
	}
	m, err := store.LastMsg(ctx, stream, scfg.Subjects(), node, events.KindWant)
	if errors.Is(err, store.ErrNoMessage) {
		return fmt.Sprintf("node %s has no want yet: stored ahead of it, filled once a want declares %s for %s", node, events.Short(path), module)
	}
	w, ok := m.Event.Payload.(*events.Want)
	if err != nil || !ok {
		return ""
	}
	for _, wm := range w.Modules {
		if wm.Name != module {
			continue
		}
		for _, f := range wm.Files {
			if f.Path == path {
				return ""
			}
		}
		return fmt.Sprintf("node %s's newest want (#%d) declares no file %s for module %s: stored ahead of it, filled once a want declares it", node, m.Event.Seq, events.Short(path), module)
	}
	return fmt.Sprintf("node %s's newest want (#%d) has no module %s: stored ahead of it, filled once a want declares it", node, m.Event.Seq, module)
}
