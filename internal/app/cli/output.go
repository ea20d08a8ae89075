package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// Output formats of -o, the same on every command.
const (
	outText = "text"
	outJSON = "json"
	outYAML = "yaml"
)

// addOutput adds -o/--output (text, json or yaml) to cmd.
func addOutput(cmd *cobra.Command, p *string, text string) {
	cmd.Flags().StringVarP(p, "output", "o", outText, "output format: text ("+text+"), json or yaml")
}

// checkOutput refuses a format other than text, json and yaml, naming -o.
func checkOutput(o string) error {
	switch o {
	case outText, outJSON, outYAML:
		return nil
	case "table": // kubectl's name for it
		return nil
	}
	return &exitError{code: ExitUsage, err: fmt.Errorf("-o %q: want text, json or yaml", o)}
}

// printAs writes v as JSON or YAML. The YAML has the JSON's field names.
func printAs(w io.Writer, format string, v any) error {
	if format == outYAML {
		return printYAML(w, v)
	}
	return printJSON(w, v)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printYAML(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var generic any
	if err := json.Unmarshal(data, &generic); err != nil {
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(generic); err != nil {
		return err
	}
	return enc.Close()
}

// version describes this build: the module version and the VCS revision
// from the build information.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown: no build information)"
	}
	return versionOf(bi)
}

// versionOf describes the build of bi.
func versionOf(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, at, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = ", modified"
			}
		}
	}
	parts := []string{v}
	if rev != "" {
		parts = append(parts, "revision "+rev+dirty)
		if at != "" {
			parts = append(parts, at)
		}
	} else {
		parts = append(parts, "revision unknown (built without VCS information)")
	}
	parts = append(parts, bi.GoVersion)
	return strings.Join(parts, ", ")
}

func newVersion() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of lanes: module version and VCS revision",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if output == outText || output == "table" {
				fmt.Fprintln(cmd.OutOrStdout(), "lanes "+version())
				return nil
			}
			info := map[string]string{"version": "(unknown)"}
			if bi, ok := debug.ReadBuildInfo(); ok {
				info["version"], info["go"], info["module"] = bi.Main.Version, bi.GoVersion, bi.Main.Path
				for _, s := range bi.Settings {
					if strings.HasPrefix(s.Key, "vcs.") {
						info[strings.TrimPrefix(s.Key, "vcs.")] = s.Value
					}
				}
			}
			return printAs(cmd.OutOrStdout(), output, info)
		},
	}
	addOutput(cmd, &output, "one line")
	return cmd
}
