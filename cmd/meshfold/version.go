package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version and commit are set at link time by make build, make package and
// deploy/Dockerfile (-ldflags "-X main.version=... -X main.commit=...");
// without them, versionInfo falls back to what the Go toolchain recorded.
var (
	version string
	commit  string
)

func init() { register(newVersionCmd) }

// buildVersion is what `meshfold version` prints: the version (the link-time
// one, else the module version go install recorded, else "devel"), the
// commit (the link-time one, else the VCS revision the toolchain stamped,
// "-dirty" when modified, else "unknown") and the Go version.
type buildVersion struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Go      string `json:"go"`
}

func versionInfo() buildVersion {
	v := buildVersion{Version: version, Commit: commit, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v.Go = bi.GoVersion
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		if v.Commit == "" {
			var rev, modified string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if rev != "" && modified == "true" {
				rev += "-dirty"
			}
			v.Commit = rev
		}
	}
	if v.Version == "" {
		v.Version = "devel"
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	return v
}

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print meshfold's version, commit and Go version",
		Long: `version prints the build's version, the commit it was built from and the
Go version that built it, one a line. Packages and the container image set
the version and commit at link time; a build from a clone without them says
devel and the commit Go stamped (unknown when it stamped none).`,
		Example: `  meshfold version`,
		Args:    noArgs(""),
		RunE: func(cmd *cobra.Command, args []string) error {
			v := versionInfo()
			fmt.Fprintf(a.stdout, "meshfold %s\ncommit   %s\ngo       %s %s/%s\n", v.Version, v.Commit, v.Go, runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
