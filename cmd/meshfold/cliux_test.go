package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/store"

	"github.com/meshfold/meshfold/store/storetest"
)

// A client command run before serve is up says which server it tried and
// asks whether serve runs, with the flag and variable that name another
// (the connect helper, for every command), in one line that does not say
// "connect" three times over (a fresh user's finding U24).
func TestNoServerHint(t *testing.T) {
	// Not parallel: t.Setenv.
	url := "nats://127.0.0.1:" + freePort(t)
	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_CONTEXT", "")
	for _, args := range [][]string{{"build", "ls"}, {"fleet"}} {
		var out bytes.Buffer
		var errb storetest.SyncBuffer
		code := run(testCtx(t), append(args, "--server", url), nil, &out, &errb)
		msg := errb.String()
		if code != exitError || strings.Count(msg, "\n") != 1 || strings.Contains(strings.ToLower(msg), "connect") ||
			!strings.Contains(msg, "no NATS server answered at "+url+": ") ||
			!strings.Contains(msg, "is `meshfold serve` running?") || !strings.Contains(msg, "--server") ||
			!strings.Contains(msg, "$NATS_URL") {
			t.Errorf("%v: exit %d\n%s", args, code, msg)
		}
	}
}

// A malformed build exits 2 (usage) in want as in build rm; a build that
// is well formed but not pushed stays a refusal for the state of things
// (1).
func TestMalformedBuildIsUsage(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	bad := "sha256:nothex"
	if _, errOut, code := m.cli(t, "build", "rm", bad); code != exitUsage {
		t.Errorf("build rm %s: exit %d %s", bad, code, errOut)
	}
	f := writeWantFile(t, `{"modules":[{"name":"web","build":"`+bad+`","runs_as":"web"}]}`)
	for _, args := range [][]string{{"want", "ace", "--new", "-f", f}, {"want", "ace", "--new", "-f", f, "--dry-run"}} {
		_, errOut, code := m.cli(t, args...)
		if code != exitUsage || !strings.Contains(errOut, "malformed") || !strings.Contains(errOut, "nothing was published") {
			t.Errorf("%v: exit %d\n%s", args, code, errOut)
		}
	}
	missing := "sha256:" + strings.Repeat("0", 64)
	f = writeWantFile(t, `{"modules":[{"name":"web","build":"`+missing+`","runs_as":"web"}]}`)
	if _, errOut, code := m.cli(t, "want", "ace", "--new", "-f", f); code != exitError {
		t.Errorf("want of a build not pushed: exit %d %s", code, errOut)
	}
}

// serve with a --listen that is no HOST:PORT is a usage error (2), and
// writes nothing to its data directory.
func TestServeBadListenIsUsage(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	var out bytes.Buffer
	var errb storetest.SyncBuffer
	code := run(testCtx(t), []string{"serve", "--data", data, "--listen", "127.0.0.1:99999"}, nil, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "--listen") {
		t.Errorf("exit %d\n%s", code, errb.String())
	}
	if ents, err := os.ReadDir(data); err != nil || len(ents) != 0 {
		t.Errorf("data directory after a refused serve: %v %v", ents, err)
	}
}

// A serve that cannot start (its NATS port busy, its console's port
// busy, TLS files that do not load) fails before it writes anything: a
// busy port once left a new signing key and trust file in --data.
func TestServeThatCannotStartWritesNothing(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	bad := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		// What to do, with the real flags: a second serve on the README's
		// default port said only "bind: address already in use" (a fresh
		// user's finding U1).
		{[]string{"--listen", busy.Addr().String()}, "address already in use: another process listens on " + busy.Addr().String() +
			" (perhaps another 'meshfold serve'): stop it, or give this serve --listen 127.0.0.1:PORT and every other command -s nats://127.0.0.1:PORT"},
		{[]string{"--listen", "127.0.0.1:0", "--http", busy.Addr().String()}, "--http: listen tcp " + busy.Addr().String() +
			": bind: address already in use: another process listens on " + busy.Addr().String() + " (perhaps another serve --http, or 'meshfold console'): stop it, or give --http 127.0.0.1:PORT"},
		{[]string{"--listen", "127.0.0.1:0", "--tls-cert", bad, "--tls-key", bad}, "TLS"},
	} {
		data := filepath.Join(t.TempDir(), "data")
		var out bytes.Buffer
		var errb storetest.SyncBuffer
		code := run(testCtx(t), append([]string{"serve", "--data", data}, c.args...), nil, &out, &errb)
		if code != exitError || !strings.Contains(errb.String(), c.says) {
			t.Errorf("serve %v: exit %d, want %d saying %q\n%s", c.args, code, exitError, c.says, errb.String())
		}
		if ents, err := os.ReadDir(data); err == nil {
			t.Errorf("serve %v: the data directory was written: %v", c.args, ents)
		}
	}
}

// secret put to a node the stream holds no event of (and no provisioner
// of which registered a key) exits 2 and says first that the node is
// unknown, then how to start a new node's provisioner.
func TestSecretPutUnknownNode(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	f := filepath.Join(t.TempDir(), "c")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := m.cli(t, "secret", "put", "acee", "app", "/run/app/c", "-f", f, "--by", "test")
	unknown, hint := strings.Index(errOut, "node acee is unknown"), strings.Index(errOut, "provision acee --from sealed")
	if code != exitUsage || unknown < 0 || hint < unknown {
		t.Errorf("exit %d\n%s", code, errOut)
	}
}

// secret put to a node the stream holds, whose provisioner registered no
// key (started with --from DIR alone, the README's first form), exits 1
// and says why and what to do: start the provisioner with --from sealed.
// It said "node has no registered provisioner key", the store's words.
func TestSecretPutNodeWithoutSealedProvisioner(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	dir := t.TempDir()
	want := filepath.Join(dir, "want.json")
	if err := os.WriteFile(want, []byte(`{"modules":[{"name":"app","build":"app:1","runs_as":"nobody","files":[{"path":"/run/app/c","mode":"0600"}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := m.cli(t, "want", "ace", "--new", "-f", want); code != 0 {
		t.Fatalf("want: exit %d\n%s%s", code, out, errs)
	}
	f := filepath.Join(dir, "c")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "secret", "put", "ace", "app", "/run/app/c", "-f", f, "--by", "test")
	if code != exitError || out != "" {
		t.Errorf("exit %d, stdout %q; want exit %d and nothing printed\n%s", code, out, exitError, errs)
	}
	for _, w := range []string{"no provisioner of node ace reads sealed secrets", "nothing was stored", "only --from DIR", "'meshfold provision ace --from sealed --from DIR"} {
		if !strings.Contains(errs, w) {
			t.Errorf("stderr does not say %q:\n%s", w, errs)
		}
	}
	if strings.Contains(errs, "store:") {
		t.Errorf("stderr says the package's words:\n%s", errs)
	}
}

// TestSecretPutRevisionSaid: a refused put (no key registered) stores
// nothing; the put after it prints the bucket's revision and says on
// stderr what it is (the bucket's sequence, not a count) and which put of
// the file this is: "revision 3" after a refusal read as a third version.
func TestSecretPutRevisionSaid(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	if _, errs, code := m.cli(t, "want", "ace", "--new", "-f", writeWantFile(t, `{"modules":[{"name":"app","build":"app:1","runs_as":"nobody","files":[{"path":"/run/app/c","mode":"0600"}]}]}`)); code != 0 {
		t.Fatalf("want: %s", errs)
	}
	f := filepath.Join(t.TempDir(), "c")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	put := []string{"secret", "put", "ace", "app", "/run/app/c", "-f", f, "--by", "test"}
	if out, errs, code := m.cli(t, put...); code != exitError || out != "" || strings.Contains(errs, "revision") {
		t.Fatalf("put with no key: exit %d %q %q", code, out, errs)
	}
	kv, err := m.js.KeyValue(ctx, m.cfg.Name+store.SecretsBucketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	curve, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := curve.PublicKey()
	if _, err := kv.Put(ctx, store.CurveKeyName("ace"), []byte(pub)); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"this is put 1 of ace app /run/app/c", "this is put 2 of ace app /run/app/c"} {
		out, errs, code := m.cli(t, put...)
		rev := regexp.MustCompile(`revision (\d+) digest`).FindStringSubmatch(out)
		if code != 0 || rev == nil || !strings.Contains(errs, "note: revision "+rev[1]+" is the secrets bucket's sequence") || !strings.Contains(errs, want) {
			t.Errorf("put %d: exit %d %q %q", i+1, code, out, errs)
		}
	}
}

// A --log-level that is no level names the four levels, as --log-format
// names its two, not slog's "unknown name".
func TestBadLogLevelNamesLevels(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	var errb storetest.SyncBuffer
	code := run(testCtx(t), []string{"fleet", "--log-level", "verbose"}, nil, &out, &errb)
	msg := errb.String()
	if code != exitUsage || !strings.Contains(msg, `--log-level "verbose": want debug, info, warn or error`) ||
		strings.Contains(msg, "slog") {
		t.Errorf("exit %d\n%s", code, msg)
	}
}

// Flags that do not fit the existing stream say, in one line, the flag
// to give: another prefix names the stream's (a fresh user's finding U24:
// a 900-character line of transforms and subjects), another partition
// count how to adopt the stream's. --log-level debug adds the detail.
func TestStreamMismatchSaysTheFlag(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	sk := filepath.Join(t.TempDir(), "rk.nk")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"fleet", "--prefix", "msh"}, `stream MESH was created with prefix "mesh": give --prefix mesh, or a new --stream for another prefix`},
		{[]string{"reconcile", "--signing-key", sk, "--prefix", "msh"}, `stream MESH was created with prefix "mesh": give --prefix mesh, or a new --stream for another prefix`},
		{[]string{"reconcile", "--signing-key", sk, "--partitions", "8"}, fmt.Sprintf("stream MESH has %d partitions, fixed for its life, not 8: drop --partitions, or 0 adopts the stream's", m.cfg.Partitions)},
	} {
		_, errOut, code := m.cli(t, c.args...)
		if code == exitOK || errOut != "meshfold: "+c.want+"\n" {
			t.Errorf("%v: exit %d\n%s\nwant meshfold: %s", c.args, code, errOut, c.want)
		}
		_, errOut, _ = m.cli(t, append(c.args, "--log-level", "debug")...)
		if !strings.Contains(errOut, c.want+" (") || !strings.Contains(errOut, "stream has") {
			t.Errorf("%v --log-level debug: no detail\n%s", c.args, errOut)
		}
	}
}

// --replicas above 1 against a server that is not clustered is a flag
// that does not fit the server: one line that names the flag and what to
// give, exit 2, not the server's bare "replicas > 1 not supported in
// non-clustered mode" with exit 1, which the packaged reconcile.env's
// --replicas 3 met restarted every 2 s (a fresh user's finding m1 of
// fresh10).
func TestReplicasOnASingleServerSaysTheFlag(t *testing.T) {
	m := startMesh(t)
	sk := filepath.Join(t.TempDir(), "rk.nk")
	_, errOut, code := m.cli(t, "reconcile", "--signing-key", sk, "--replicas", "3")
	if code != exitUsage || strings.Count(strings.TrimSpace(errOut), "\n") != 0 ||
		!strings.Contains(errOut, "--replicas 3: the server is not clustered, and keeps one replica of a stream: give --replicas 1 (or none: 0 keeps the stream's)") ||
		!strings.Contains(errOut, "MESHFOLD_RECONCILE_ARGS") {
		t.Errorf("reconcile --replicas 3 on one server: exit %d, want %d with one line naming the flag:\n%s", code, exitUsage, errOut)
	}
}

// A reconcile refused before it starts (another reconciler folds the
// stream; flags that do not fit it) leaves no new signing key or trust
// file behind (a fresh user's finding U24: a new reconcilers.pub beside
// the operator's files); an existing key is kept.
func TestRefusedReconcileCreatesNothing(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	m.serveReconciler(t)
	dir := t.TempDir()
	sk := filepath.Join(dir, "rk.nk")
	_, errOut, code := m.cli(t, "reconcile", "--signing-key", sk)
	if code == exitOK || !strings.Contains(errOut, "an ungrouped reconciler folds this stream") {
		t.Fatalf("reconcile beside serve's reconciler: exit %d\n%s", code, errOut)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Errorf("files after a refused reconcile: %v %v", ents, err)
	}
	// A key that was there stays (and the trust file it got is the
	// refused start's, removed).
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	if err := os.WriteFile(sk, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := m.cli(t, "reconcile", "--signing-key", sk, "--prefix", "msh"); code == exitOK || !strings.Contains(errOut, "give --prefix mesh") {
		t.Fatalf("reconcile --prefix msh: exit %d\n%s", code, errOut)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 1 || ents[0].Name() != "rk.nk" {
		t.Errorf("files after a refused reconcile with a key: %v %v", ents, err)
	}
}

// A --dir without a previous run is taken; one with its nats directory
// is refused (the end-to-end refusal is TestDemo's).
func TestDemoDirFree(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "ace-root"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := demoDirFree(dir); err != nil {
		t.Errorf("a --dir without a previous run: %v", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "nats"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := demoDirFree(dir); err == nil || !strings.Contains(err.Error(), "holds a demo from") {
		t.Errorf("a --dir with a previous run: %v", err)
	}
}
