package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/internal/lib/vet"
)

func newVet() *cobra.Command {
	var (
		output string
		allow  []string
		tests  bool
	)
	cmd := &cobra.Command{
		Use:   "vet [packages]",
		Short: "Report code that loses the lane: dropped contexts, runaway goroutines, clients that bypass lanes",
		Long: `vet loads the packages (patterns as for go vet: ./..., import paths, folders;
default ".") from the current module and runs the lanes analyzers on them:

  lanectx     context.Background() or context.TODO() where a request's context is in scope
  lanego      a goroutine that uses the request's context and may outlive the request
  lanehttp    an HTTP request built without a context where one is in scope
  lanebypass  a gRPC target, an http.Client or a NATS publish that bypasses lanes

A finding is silenced by '//lanes:ignore <reason>' on its line or alone on the
line above it; the reason is required. The same analyzers run under
'go vet -vettool=$(which lanes-vet)' (go install ./cmd/lanes-vet). See docs/vet.md.

Output: one line per finding, file:line:col: message (analyzer); with -o json,
go vet's -json form.

Exit status: 0 when nothing is found, 1 when something is, 2 on a usage error
or when the packages cannot be loaded or type-checked.`,
		Example: `  lanes vet ./...
  lanes vet -o json ./internal/...
  lanes vet --allow github.com/acme/shop/internal/registry ./...`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			res, err := vet.Run(cmd.Context(), args, vet.Options{Tests: tests, Allow: allow})
			var le *vet.LoadError
			switch {
			case errors.As(err, &le):
				return &exitError{code: ExitUsage, err: le}
			case err != nil:
				return &exitError{code: ExitFail, err: err}
			}
			if err := printVet(cmd.OutOrStdout(), res, output); err != nil {
				return &exitError{code: ExitFail, err: err}
			}
			if len(res.Findings) > 0 {
				return &exitError{code: ExitFail}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json (as go vet -json) or yaml (the same fields)")
	cmd.Flags().StringSliceVar(&allow, "allow", nil, "package path prefixes, gRPC target prefixes or functions (path.Func) whose calls may bypass lanes (lanebypass)")
	cmd.Flags().BoolVar(&tests, "tests", true, "analyse test files too")
	return cmd
}

func printVet(w io.Writer, res *vet.Result, output string) error {
	switch output {
	case outJSON:
		return res.PrintJSON(w)
	case outYAML:
		var b bytes.Buffer
		if err := res.PrintJSON(&b); err != nil {
			return err
		}
		var v any
		if err := json.Unmarshal(b.Bytes(), &v); err != nil {
			return err
		}
		return printYAML(w, v)
	}
	for _, f := range res.Findings {
		if _, err := fmt.Fprintln(w, f); err != nil {
			return err
		}
	}
	return nil
}
