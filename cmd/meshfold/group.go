package main

import (
	"github.com/spf13/cobra"
)

// groupFlags put `meshfold reconcile` in a group of instances that share
// the stream's partitions (engine.Group).
type groupFlags struct {
	name     string
	instance string
}

func (f *groupFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.name, "group", "", "join the reconciler group NAME: its instances share the partitions, each folded by one instance at a time, and take over those of an instance that dies or hangs (default: fold every partition alone)")
	fl.StringVar(&f.instance, "instance", "", "this instance's name in --group, unique in it (default <hostname>-<pid>)")
}

func (f *groupFlags) enabled() bool { return f != nil && f.name != "" }
