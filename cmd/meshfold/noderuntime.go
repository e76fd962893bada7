package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

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
// shims are this executable, run as `meshfold shim DIR`. The state
// directory is made traversable (0711) so that modules running as their
// own accounts reach their bundles; what it holds stays private (the HMAC
// key 0600, the runtime's directory 0700).
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
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("the shim command: %w", err)
	}
	return process.Open(process.Config{Node: name, Root: root, StateDir: stateDir, Fetcher: cache,
		Shim: []string{exe, "shim"}, Logger: log.With("component", "process")})
}

func init() { register(func(*app) *cobra.Command { return newShimCmd() }) }

// newShimCmd is `meshfold shim DIR`: the supervisor of one module,
// started by the process runtime, never by hand. It is a top-level
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
