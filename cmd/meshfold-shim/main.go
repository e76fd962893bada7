package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/meshfold/meshfold/node/process/shim"
)

// version and commit are set at link time, as meshfold's are (make build,
// make dist, deploy/Dockerfile).
var (
	version string
	commit  string
)

func main() {
	switch {
	case len(os.Args) == 2 && os.Args[1] == "--version":
		fmt.Printf("meshfold-shim %s commit %s protocol %d\n", orDevel(version), orUnknown(commit), shim.Protocol)
	case len(os.Args) == 2 && len(os.Args[1]) > 0 && os.Args[1][0] != '-':
		os.Exit(shim.Main(os.Args[1]))
	default:
		fmt.Fprintln(os.Stderr, "usage: meshfold-shim DIR (started by the node agent, never by hand) | meshfold-shim --version")
		os.Exit(2)
	}
}

func orDevel(v string) string {
	if v != "" {
		return v
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

func orUnknown(c string) string {
	if c != "" {
		return c
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
