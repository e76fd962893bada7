package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
)

func main() {
	binary := flag.String("binary", "", "the meshfold binary to package (required)")
	shim := flag.String("shim", "", "the meshfold-shim binary to package beside it (required)")
	version := flag.String("version", "", "the version (git describe: v1.2.3, v1.2.3-4-gabc, or a commit hash)")
	arch := flag.String("arch", runtime.GOARCH, "the binary's architecture (Go's name: amd64, arm64)")
	out := flag.String("out", "dist", "directory the packages are written to")
	formats := flag.String("formats", "deb,rpm", "package formats, comma separated")
	flag.Parse()
	if *binary == "" || *shim == "" {
		fmt.Fprintln(os.Stderr, "package: -binary and -shim are required")
		os.Exit(2)
	}
	paths, err := Build(Options{Binary: *binary, Shim: *shim, Version: *version, Arch: *arch, Out: *out, Formats: strings.Split(*formats, ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "package:", err)
		os.Exit(1)
	}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "package:", err)
			os.Exit(1)
		}
		fmt.Printf("%s %d bytes\n", p, st.Size())
	}
}
