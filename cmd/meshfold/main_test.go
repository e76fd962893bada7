package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/store"
)

// TestMain runs main when this test binary is started as a process
// runtime shim: the demo's runtime starts its shims as `<this executable>
// shim DIR`, which under `go test` is the test binary (the testing
// package never passes a bare "shim" as the first argument, so nothing
// else lands there). Otherwise it points meshfold's per-machine state
// ($XDG_STATE_HOME: the node agents' default state directories) at
// a temporary directory, so that no test writes into the home or /var/lib
// of the machine, and records itself as the parent its shims die with.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		// A shim of a test ends with the test process that started it
		// (SIGTERM: it stops its module first): a test binary killed from
		// outside leaves neither behind.
		testproc.DieWithParent(syscall.SIGTERM)
		main()
		return
	}
	if len(os.Args) > 2 && os.Args[1] == readmeWatchdogArg {
		// A README session's watchdog (readme_watchdog_test.go).
		readmeWatchdog(os.Args[2])
		return
	}
	if len(os.Args) > 2 && os.Args[1] == "burn" {
		// The contended benchmarks' burner (mixes_bench_test.go).
		share, err := strconv.ParseFloat(os.Args[2], 64)
		if err != nil {
			panic(err)
		}
		burn(share)
		return
	}
	testproc.MarkParent()
	// Every process this binary starts (a helper process, the shim of an
	// in-process agent: both this binary again) exits at once under
	// -race, not after the race runtime's second at exit (atexit_sleep_ms,
	// default 1000): agents wait for their stopped shims, tests for their
	// helpers. Set here, once, so that no test needs t.Setenv for it,
	// which would keep it from running in parallel.
	if raceBuild && !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
		os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	// A helper process (TestHelperProcess, re-executed by a test) makes
	// its state directory inside its test binary's: it ends with os.Exit
	// or is killed, so it never removes its own, and the test binary's
	// RemoveAll below takes both.
	root := os.Getenv(stateRootEnv)
	dir, err := os.MkdirTemp(root, "meshfold-cmd-test-state")
	if err != nil && root != "" {
		root = "" // its test binary's directory is gone: one of its own
		dir, err = os.MkdirTemp("", "meshfold-cmd-test-state")
	}
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_STATE_HOME", dir)
	if root == "" {
		os.Setenv(stateRootEnv, dir)
	}
	code := m.Run()
	if root == "" {
		os.RemoveAll(dir)
	}
	removeBenchBinary()
	os.Exit(code)
}

// The tests of this package call t.Parallel: most of their time is spent
// waiting on servers, agents, leases and timers, not computing. A test
// stays serial, and says why, when it sets the environment (t.Setenv) or
// a package-level hook, or times something against a limit. The serial
// ones run first, alone; then the parallel ones, -parallel at a time. A
// server a test restarts on its port listens on a port reserved with
// storetest.FreeAddr (or a storetest cluster's), which no other bind
// takes while it is down.

// stateRootEnv names the state directory of the test binary that started
// this one, in which a helper process makes its own.
const stateRootEnv = "MESHFOLD_CMD_TEST_STATE_ROOT"

// testSigner returns a reconciler signing key and a trust file naming it,
// for tests that publish plans or knocks as the reconciler would.
func testSigner(t testing.TB) (*store.Signer, string) {
	t.Helper()
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), trustFileName)
	if err := store.WriteTrustFile(path, s.PublicKey()); err != nil {
		t.Fatal(err)
	}
	return s, path
}

// TestLoopFlagsRefused: serve and reconcile refuse a snapshot cadence of
// zero or less (once silently taken as the default), --pprof without
// --metrics and a --max-age below the dedup window, with exit 2, before they start anything.
func TestLoopFlagsRefused(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	data := filepath.Join(t.TempDir(), "data")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--snapshot-interval", "0"}, "--snapshot-interval 0s: must be more than 0"},
		{[]string{"--snapshot-interval", "-1s"}, "--snapshot-interval -1s: must be more than 0"},
		{[]string{"--snapshot-every", "0"}, "--snapshot-every 0: must be at least 1 event"},
		{[]string{"--pprof"}, "--pprof needs --metrics"},
		// Not the server's raw "duplicates window can not be larger then
		// max age" (a fresh user's finding U28).
		{[]string{"--max-age", "20s"}, "--max-age 20s: must be at least --dedup-window (2m0s)"},
		{[]string{"--max-age", "30s", "--dedup-window", "1m"}, "--max-age 30s: must be at least --dedup-window (1m0s)"},
		{[]string{"--max-age", "-1h"}, "--max-age -1h0m0s: must not be negative"},
	} {
		for _, role := range [][]string{{"serve", "--data", data, "--listen", "127.0.0.1:0"}, {"reconcile", "--server", "nats://127.0.0.1:1"}} {
			args := append(append([]string{}, role...), c.args...)
			code, _, errs := runCLI(ctx, args...)
			if code != exitUsage || !strings.Contains(errs, c.want) {
				t.Errorf("meshfold %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(args, " "), code, errs, exitUsage, c.want)
			}
		}
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("serve created its data directory before refusing its flags (%v)", err)
	}
}
