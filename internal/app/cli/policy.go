package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/policy"
)

func newPolicy() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Get, apply or validate the policy document",
		Long: `policy reads and writes the one policy document in force (docs/policy.md).

An invalid document is refused as a whole, with its file, line and field, and
exit status 2; the document in force does not change.`,
	}
	cmd.AddCommand(newPolicyGet(), newPolicyApply(), newPolicyValidate())
	return cmd
}

func newPolicyGet() *cobra.Command {
	var cf clientFlags
	var output string
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Print the policy document in force, as it was applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				doc, err := c.Policy(ctx)
				if err != nil {
					return apiFailure(c, err)
				}
				if output == outJSON {
					return printJSON(cmd.OutOrStdout(), doc)
				}
				if doc.Revision == 0 {
					fmt.Fprintln(cmd.ErrOrStderr(), "lanes: no policy document has been applied; the empty policy is in force")
					return nil
				}
				io.WriteString(cmd.OutOrStdout(), doc.Raw)
				if n := len(doc.Raw); n > 0 && doc.Raw[n-1] != '\n' {
					fmt.Fprintln(cmd.OutOrStdout())
				}
				return nil
			})
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", outText, "output format: text or yaml (the document as applied), or json (with the revision and the parsed policy)")
	return cmd
}

// readPolicyFile reads and parses FILE ("-" for stdin). A file that cannot
// be read or parsed is a usage error naming the file and line.
func readPolicyFile(cmd *cobra.Command, file string) ([]byte, error) {
	if file == "" {
		return nil, &exitError{code: ExitUsage, err: errors.New("give the document as FILE or with -f FILE (- for stdin)")}
	}
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(cmd.InOrStdin())
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, &exitError{code: ExitUsage, err: fmt.Errorf("%s: cannot read: %w", file, unwrapPath(err))}
	}
	if _, err := policy.Parse(file, data); err != nil {
		return nil, &exitError{code: ExitUsage, err: err}
	}
	return data, nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// policyRefusal turns the server's refusal of a document into the same
// message as a local one: FILE:LINE: field FIELD: MSG, exit 2.
func policyRefusal(c *apiClient, file string, err error) error {
	var ae *adminapi.Error
	if errors.As(err, &ae) && ae.Code == adminapi.CodeInvalidPolicy {
		pe := &policy.Error{File: file, Line: ae.Line, Field: ae.Field, Msg: ae.Message}
		return &exitError{code: ExitUsage, err: pe}
	}
	return apiFailure(c, err)
}

func newPolicyApply() *cobra.Command {
	var cf clientFlags
	var file string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply FILE | -f FILE",
		Short: "Validate a policy document and put it in force",
		Long: `apply validates a policy document and puts it in force.

With --dry-run it applies nothing: it prints, for every service and lane of
today's fleet (and every lane either document names), where a request would
go under the document in force and under FILE, for those that change, and
every lane lifetime (expires) that would change.

A lane lifetime in force (set with lanes lane expire) that FILE does not set
is kept, and said so: FILE sets or moves one with lanes.<lane>.expires, and
lanes lane expire LANE --never lifts one.`,
		Example: `  lanes policy apply policy.yaml
  lanes policy apply --dry-run policy.yaml
  lanes policy get > p.yaml && $EDITOR p.yaml && lanes policy apply -f p.yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := fileArg(&file, args); err != nil {
				return err
			}
			data, err := readPolicyFile(cmd, file)
			if err != nil {
				return err
			}
			if dryRun {
				return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
					return dryRunPolicy(ctx, cmd.OutOrStdout(), c, file, data)
				})
			}
			return cf.call(cmd, func(ctx context.Context, c *apiClient) error {
				doc, err := c.PutPolicy(ctx, data)
				if err != nil {
					return policyRefusal(c, file, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "policy applied (revision %d)\n", doc.Revision)
				printKept(cmd.OutOrStdout(), file, doc.Kept)
				return nil
			})
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "the policy document (YAML or JSON; - for stdin)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the service and lane routes that would change, and apply nothing")
	return cmd
}

// fileArg takes the document from the argument or -f, not both.
func fileArg(file *string, args []string) error {
	if len(args) == 1 {
		if *file != "" && *file != args[0] {
			return &exitError{code: ExitUsage, err: fmt.Errorf("give the document once: as FILE (%s) or with -f (%s)", args[0], *file)}
		}
		*file = args[0]
	}
	return nil
}

func newPolicyValidate() *cobra.Command {
	var cf clientFlags
	var file string
	var offline bool
	cmd := &cobra.Command{
		Use:   "validate FILE | -f FILE",
		Short: "Check a policy document without applying it",
		Long: `validate checks a policy document here, then with the control plane (which
decides, should its version differ). With --offline it checks here only, so
that it needs no running control plane (for CI).

Exit status: 0 when valid, 2 when invalid (with FILE:LINE: field FIELD: why).`,
		Example: `  lanes policy validate --offline policy.yaml`,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := fileArg(&file, args); err != nil {
				return err
			}
			data, err := readPolicyFile(cmd, file)
			if err != nil {
				return err
			}
			if !offline {
				if err := cf.call(cmd, func(ctx context.Context, c *apiClient) error {
					if _, err := c.ValidatePolicy(ctx, data); err != nil {
						return policyRefusal(c, file, err)
					}
					return nil
				}); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: valid\n", file)
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "the policy document (YAML or JSON; - for stdin)")
	cmd.Flags().BoolVar(&offline, "offline", false, "validate here only, without the control plane")
	return cmd
}
