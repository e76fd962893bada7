package main

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/spf13/cobra"
)

// helpWidth is the widest line a command's long help may have: what an
// 80-column terminal shows without wrapping it mid-word.
const helpWidth = 80

// Every command's help reads as an operator meets it: its long text is
// wrapped within helpWidth columns (an indented example or table may not
// be wrapped, and is exempt only when indented), and every command an
// operator runs (not a group of subcommands, not a hidden internal one)
// shows at least one example.
func TestHelpTexts(t *testing.T) {
	t.Parallel()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "completion" || c.Name() == "help" {
			return
		}
		for i, line := range strings.Split(c.Long, "\n") {
			if utf8.RuneCountInString(line) > helpWidth && !strings.HasPrefix(line, "  ") {
				t.Errorf("%s: line %d of its help is %d columns, over %d:\n%s", c.CommandPath(), i+1, utf8.RuneCountInString(line), helpWidth, line)
			}
		}
		if c.Runnable() && !c.HasSubCommands() && c.Example == "" {
			t.Errorf("%s: no example in its help", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(nil, nil, nil))
}
