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
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/node/process"
	"github.com/meshfold/meshfold/node/process/shim"
)

// The runtimes of `meshfold node --runtime` (DESIGN.md §8).
const (
	runtimeProcess = "process" // the default: modules are processes
	runtimeRecord  = "record"  // records modules, starts nothing (dry runs)
)

// bundleCacheDir is where a node agent keeps unpacked bundles, under its
// state directory.
func bundleCacheDir(stateDir string) string { return filepath.Join(stateDir, "bundles") }

// openProcessRuntime opens the process runtime of node name: bundles come
// from the builds bucket of stream through a cache in the state directory;
// shims are [shimCommand]'s. The state directory is made traversable
// (0711) so that modules running as their own accounts reach their
// bundles; what it holds stays private (the HMAC key 0600, the runtime's
// directory 0700).
func openProcessRuntime(name, root, stateDir string, js jetstream.JetStream, stream string, log *slog.Logger) (*process.Runtime, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	if err := os.Chmod(stateDir, 0o711); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	cache, err := bundle.NewCache(bundleCacheDir(stateDir), bundle.NewStore(js, stream))
	if err != nil {
		return nil, err
	}
	cmd, err := shimCommand(log)
	if err != nil {
		return nil, err
	}
	return process.Open(process.Config{Node: name, Root: root, StateDir: stateDir, Fetcher: cache,
		Shim: cmd, Logger: log.With("component", "process")})
}

// shimBinary is the dedicated shim's file name, installed beside meshfold.
const shimBinary = "meshfold-shim"

// shimEnv names a meshfold-shim to use instead of the one beside this
// executable.
const shimEnv = "MESHFOLD_SHIM"

// shimCommand is the command the process runtime starts a module's shim
// with (the runtime appends the module's directory): the meshfold-shim
// that $MESHFOLD_SHIM names, else the one beside this executable, each
// only if `meshfold-shim --version` says it speaks this build's protocol
// (shim.Protocol); without either (go run, a bare binary), this executable
// as `meshfold shim`, said once at start: the same supervisor, about
// 1.8 MB more memory per module (docs/architecture.md, "Memory per
// shim").
//
// Errors: $MESHFOLD_SHIM set and not a meshfold-shim of this protocol; a
// meshfold-shim beside this executable of another protocol (a stale
// file: an agent never drives a shim it does not understand).
func shimCommand(log *slog.Logger) ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("the shim command: %w", err)
	}
	path, set := os.LookupEnv(shimEnv)
	if !set || path == "" {
		path = filepath.Join(filepath.Dir(exe), shimBinary)
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			log.Info("no "+shimBinary+" beside this executable: each module's shim is meshfold itself (`meshfold shim`), about 1.8 MB more memory per module; install "+shimBinary+" beside it or set "+shimEnv,
				"looked_for", path)
			return []string{exe, "shim"}, nil
		}
	}
	v, err := shimVersion(path)
	if err != nil {
		return nil, fmt.Errorf("the shim %s: %w", path, err)
	}
	if v.protocol != shim.Protocol {
		return nil, fmt.Errorf("the shim %s (%s) speaks protocol %d, this meshfold (%s) protocol %d: install the %s of this release beside meshfold, or name one with %s",
			path, v.version, v.protocol, versionInfo().Version, shim.Protocol, shimBinary, shimEnv)
	}
	log.Info("module shims: "+path, "shim_version", v.version, "protocol", v.protocol)
	return []string{path}, nil
}

// shimInfo is what `meshfold-shim --version` says.
type shimInfo struct {
	version  string
	protocol int
}

// shimVersion runs `path --version` (5 s at most) and reads its
// "meshfold-shim VERSION commit COMMIT protocol N" line.
func shimVersion(path string) (shimInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return shimInfo{}, fmt.Errorf("%s --version: %w", path, err)
	}
	f := strings.Fields(string(out))
	if len(f) != 6 || f[0] != shimBinary || f[2] != "commit" || f[4] != "protocol" {
		return shimInfo{}, fmt.Errorf("%s --version said %q: not a %s", path, strings.TrimSpace(string(out)), shimBinary)
	}
	p, err := strconv.Atoi(f[5])
	if err != nil {
		return shimInfo{}, fmt.Errorf("%s --version said %q: no protocol number", path, strings.TrimSpace(string(out)))
	}
	return shimInfo{version: f[1] + " commit " + f[3], protocol: p}, nil
}

func init() { register(func(*app) *cobra.Command { return newShimCmd() }) }

// newShimCmd is `meshfold shim DIR`: the supervisor of one module,
// started by the process runtime, never by hand, where no meshfold-shim
// is installed (see shimCommand); an agent adopts and stops the ones an
// earlier build started. It is a top-level
// command, not a subcommand of node, so that a node named "shim" is a node
// like any other.
func newShimCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "shim DIR",
		Short:  "The per-module supervisor the process runtime starts (internal)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if code := shim.Main(args[0]); code != 0 {
				return withCode(code, fmt.Errorf("shim %s exited with %d", args[0], code))
			}
			return nil
		},
	}
}

// nodeRuntime returns the runtime --runtime names and a function to call
// when the agent stops: the process runtime lets go of its shims (the
// modules keep running; the next agent adopts them).
func nodeRuntime(kind, name, root, stateDir, runtimeDir string, js jetstream.JetStream, stream string, log *slog.Logger) (node.Runtime, func(), error) {
	switch kind {
	case runtimeRecord:
		if runtimeDir == "" {
			runtimeDir = filepath.Join(root, node.ReservedDir, "modules")
		}
		rt, err := node.NewDirRuntime(runtimeDir)
		return rt, func() {}, err
	case runtimeProcess:
		rt, err := openProcessRuntime(name, root, stateDir, js, stream, log)
		if err != nil {
			return nil, nil, err
		}
		return rt, func() { _ = rt.Close() }, nil
	}
	return nil, nil, withCode(exitUsage, fmt.Errorf("--runtime %q: want %s or %s", kind, runtimeProcess, runtimeRecord))
}
