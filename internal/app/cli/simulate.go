package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/internal/lib/scenario"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

func newSimulate() *cobra.Command {
	var jsonOut, live bool
	var output, policyFile string
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "simulate FILE|DIR... | simulate --live [--policy FILE]",
		Short: "Replay routing scenarios against the routing engine and check their expectations",
		Long: `simulate replays each scenario file against the real routing engine, with a
virtual clock, and checks its expectations. The format is described, with
examples, in examples/scenarios/README.md.

Arguments are scenario files; a directory stands for the *.yaml and *.yml
files directly inside it, in name order. A pattern such as 'dir/*.yaml' that
the shell did not expand is expanded here.

Output: one summary line per file on stdout ("ok" or "FAIL"), and for each
failed step its file, line and step number, what was expected, what the
engine answered and why. A file that cannot be read or does not follow the
format is reported on stderr with its file, line and field; the other files
are still run.

With -o json, stdout has one JSON object per step instead:
  {"file","step","lane","eligible":[ids],"error","reason","ok"}
plus "message" on a failed step; with -o yaml, the same as a YAML list.

Exit status: 0 when every expectation of every file holds; 1 when an
expectation fails; 2 when a file cannot be read or is malformed, or on a usage
error. With several files the worst status wins (2 over 1 over 0).

With --live, simulate turns today's fleet into a scenario file, on stdout: the
instances and the policy in force that the admin API shows (see 'lanes ls'),
and one step per service and lane whose expectations are today's routes. It
passes as it is; edit its policy (or give the one to try with --policy FILE)
and replay it: the steps that fail are the routes the change would move.`,
		Example: `  lanes simulate examples/scenarios/*.yaml
  lanes simulate examples/scenarios
  lanes simulate -o json my-policy-test.yaml
  lanes simulate --live > fleet.yaml && lanes simulate fleet.yaml
  lanes simulate --live --policy new-policy.yaml > try.yaml && lanes simulate try.yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if live {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.MinimumNArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if policyFile != "" && !live {
				return &exitError{code: ExitUsage, err: errors.New("--policy goes with --live")}
			}
			if live {
				return simulateLive(cmd, &cf, policyFile)
			}
			if jsonOut {
				output = outJSON
			}
			code := simulate(cmd.OutOrStdout(), cmd.ErrOrStderr(), args, output)
			if code != ExitOK {
				return &exitError{code: code}
			}
			return nil
		},
	}
	addOutput(cmd, &output, "a summary line per file")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "the same as -o json")
	cmd.Flags().MarkHidden("json")
	cmd.Flags().BoolVar(&live, "live", false, "print a scenario of today's fleet and policy, from the admin API")
	cmd.Flags().StringVar(&policyFile, "policy", "", "with --live: the policy document to put in the scenario instead of the one in force (the expectations stay today's)")
	cf.add(cmd)
	return cmd
}

// simulateLive prints the scenario of the live fleet.
func simulateLive(cmd *cobra.Command, cf *clientFlags, policyFile string) error {
	var raw []byte
	if policyFile != "" {
		data, err := readPolicyFile(cmd, policyFile)
		if err != nil {
			return err
		}
		raw = data
	}
	return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
		doc, err := c.Policy(ctx)
		if err != nil {
			return apiFailure(c, err)
		}
		now := &policy.Policy{}
		if doc.Raw != "" {
			if now, err = policy.Parse("the policy in force", []byte(doc.Raw)); err != nil {
				return &exitError{code: ExitFail, err: err}
			}
		}
		if raw == nil {
			raw = []byte(doc.Raw)
		}
		list, err := c.Instances(ctx, "")
		if err != nil {
			return apiFailure(c, err)
		}
		insts := make([]registry.Instance, 0, len(list))
		for _, in := range list {
			insts = append(insts, in.Instance)
		}
		if len(insts) == 0 {
			return &exitError{code: ExitFail, err: errors.New("no instance is registered: a scenario needs at least one")}
		}
		name := fmt.Sprintf("the fleet of %s at %s, policy revision %d", c.URL(), time.Now().UTC().Format(time.RFC3339), doc.Revision)
		if policyFile != "" {
			name += ", with the policy of " + policyFile
		}
		data, err := scenario.FromFleet(name, raw, now, insts)
		if err != nil {
			return &exitError{code: ExitFail, err: err}
		}
		_, err = cmd.OutOrStdout().Write(data)
		return err
	})
}

// simulate runs the scenarios named by args and returns the exit code.
func simulate(stdout, stderr io.Writer, args []string, output string) int {
	code := ExitOK
	worst := func(c int) {
		if c > code {
			code = c
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	for _, in := range expandArgs(args) {
		if in.err != nil {
			fmt.Fprintf(stderr, "%v\n", in.err)
			worst(ExitUsage)
			continue
		}
		f := in.file
		data, err := os.ReadFile(f)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			fmt.Fprintf(stderr, "%s: cannot read: %v\n", f, err)
			worst(ExitUsage)
			continue
		}
		s, err := scenario.Parse(f, data)
		if err != nil {
			fmt.Fprintf(stderr, "%v\n", err)
			worst(ExitUsage)
			continue
		}
		res := scenario.Run(s, scenario.Options{})
		if !res.OK() {
			worst(ExitFail)
		}
		if output == outJSON || output == outYAML {
			for _, r := range res.Steps {
				var err error
				if output == outJSON {
					err = enc.Encode(r)
				} else {
					err = printYAML(stdout, []any{r})
				}
				if err != nil {
					fmt.Fprintf(stderr, "lanes: %v\n", err)
					return ExitUsage
				}
			}
			continue
		}
		printSummary(stdout, &res)
	}
	return code
}

func printSummary(w io.Writer, res *scenario.Result) {
	fails := res.Failures()
	steps := plural(len(res.Steps), "step")
	if len(fails) == 0 {
		fmt.Fprintf(w, "ok   %s  %s  (%s)\n", res.File, res.Name, steps)
		return
	}
	fmt.Fprintf(w, "FAIL %s  %s  (%s, %d failed)\n", res.File, res.Name, steps, len(fails))
	for _, r := range fails {
		fmt.Fprintf(w, "  %s:%d: step %d: %s\n", r.File, r.Line, r.Step, r.Message)
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// input is one file to run, or an argument that names none.
type input struct {
	file string
	err  error
}

// expandArgs turns the arguments into files, in order: a directory stands
// for its *.yaml and *.yml files, and a pattern that names no file is
// expanded with filepath.Glob (for shells that do not, or quoted patterns).
func expandArgs(args []string) []input {
	var out []input
	for _, a := range args {
		info, err := os.Stat(a)
		switch {
		case err == nil && info.IsDir():
			var found []string
			for _, pat := range []string{"*.yaml", "*.yml"} {
				m, _ := filepath.Glob(filepath.Join(globEscape(a), pat))
				found = append(found, m...)
			}
			sort.Strings(found)
			if len(found) == 0 {
				out = append(out, input{err: fmt.Errorf("%s: no scenario files (*.yaml, *.yml) in the directory", a)})
			}
			for _, f := range found {
				out = append(out, input{file: f})
			}
		case err != nil && errors.Is(err, fs.ErrNotExist) && strings.ContainsAny(a, "*?["):
			m, gerr := filepath.Glob(a)
			if gerr != nil || len(m) == 0 {
				out = append(out, input{err: fmt.Errorf("%s: no file matches", a)})
			}
			for _, f := range m {
				out = append(out, input{file: f})
			}
		default:
			// A file, or something that cannot be read: reading it
			// reports the error.
			out = append(out, input{file: a})
		}
	}
	return out
}

// globEscape quotes the pattern characters of a literal path.
func globEscape(p string) string {
	var b strings.Builder
	for _, r := range p {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
