package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	// YAML from the very JSON the structs encode to: yaml.v3 parses JSON
	// (a subset of YAML 1.2) into a node tree that keeps the keys' order,
	// and prints it in block style, so -o yaml has exactly -o json's field
	// names and order with no yaml tag to keep in step. Already in the
	// build through the metrics client.
	"go.yaml.in/yaml/v3"

	"github.com/spf13/cobra"
)

// Output formats of the read verbs (-o).
const (
	outTable = "table"
	outJSON  = "json"
	outYAML  = "yaml"
)

// outputFlag is the -o flag of a read verb; --json, where a verb had it,
// stays as a synonym of -o json.
type outputFlag struct {
	format string
	json   bool
}

func (o *outputFlag) add(cmd *cobra.Command, jsonAlias string) {
	cmd.Flags().StringVarP(&o.format, "output", "o", outTable, "output format: table, json or yaml")
	if jsonAlias != "" {
		cmd.Flags().BoolVar(&o.json, "json", false, jsonAlias)
	}
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{outTable, outJSON, outYAML}, cobra.ShellCompDirectiveNoFileComp))
}

// get returns the format asked for; an unknown one is a usage error.
func (o *outputFlag) get() (string, error) {
	if o.json {
		if o.format != outTable && o.format != outJSON {
			return "", withCode(exitUsage, fmt.Errorf("--json and -o %s do not go together", o.format))
		}
		return outJSON, nil
	}
	switch o.format {
	case outTable, outJSON, outYAML:
		return o.format, nil
	}
	return "", withCode(exitUsage, fmt.Errorf("-o %q: want table, json or yaml", o.format))
}

// writeValue writes v as one JSON line, or as one YAML document (a
// "---" line first, so that several values make a stream of documents).
func writeValue(w io.Writer, format string, v any) error {
	if format != outYAML {
		return writeJSON(w, v)
	}
	b, err := toYAML(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "---\n%s", b)
	return err
}

// toYAML encodes v as JSON, then prints that JSON as block-style YAML.
func toYAML(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(j, &doc); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	blockStyle(&doc)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	return b.Bytes(), nil
}

// blockStyle clears the flow style JSON's braces gave every node; the
// encoder quotes a string that would otherwise read as another type, and
// this quotes the words YAML 1.1 readers take for booleans (yes, off…).
func blockStyle(n *yaml.Node) {
	n.Style &^= yaml.FlowStyle | yaml.DoubleQuotedStyle | yaml.SingleQuotedStyle
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && yaml11Bool[strings.ToLower(n.Value)] {
		n.Style = yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}

var yaml11Bool = map[string]bool{"y": true, "yes": true, "n": true, "no": true, "on": true, "off": true}
