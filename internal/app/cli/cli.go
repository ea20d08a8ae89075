// Package cli implements the lanes command line: the cobra command tree
// rooted at `lanes` and every subcommand's behaviour. cmd/lanes only wires it
// to the process (arguments, standard streams, exit code), so that the
// commands can be run and tested in-process through Main.
//
// Exit codes are shared by every command: 0 for success, 1 when the command
// ran and found a problem (for `lanes simulate`: an expectation that does not
// hold; for the commands that talk to the admin API: a refusal, or a control
// plane that cannot be reached; for `lanes up`: a failure to start), 2 for a
// usage error or an input that cannot be read or parsed (a bad setting, an
// invalid policy document).
//
// `lanes up` and `lanes demo` run the control plane (internal/app/controlplane);
// `ls`, `policy`, `route explain`, `dev`, `token` and `lane` are clients of
// its admin API (adminclient).
package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	ExitOK    = 0 // everything held
	ExitFail  = 1 // the command ran, and what it checked does not hold
	ExitUsage = 2 // bad usage, or an input that cannot be read or parsed
)

// exitError ends a command with a code. Err, when set, has not been printed
// yet; Main prints it.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

// Main runs the lanes command line with args (without the program name),
// writing to stdout and stderr, and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	root := NewRoot(stdout, stderr)
	if args == nil {
		args = []string{} // cobra would read nil as os.Args[1:]
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "lanes: %v\n", ee.err)
		}
		return ee.code
	}
	// Anything cobra refuses (an unknown command or flag, a wrong number
	// of arguments) is a usage error.
	fmt.Fprintf(stderr, "lanes: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
	return ExitUsage
}

// NewRoot returns the `lanes` command with all its subcommands, writing to
// stdout and stderr.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "lanes",
		Short: "Route requests by lane",
		Long: `lanes routes each request to the instances of its lane: a developer's laptop,
a feature environment or a canary, falling back to the baseline (the stable
environment) when the lane has no instance of a service.

Exit status, for every command:
  0  success
  1  failure: the command ran and what it checked does not hold, the admin
     API refused it, the control plane cannot be reached, or a name matches
     nothing (a typo; --force where offered)
  2  usage or bad input: an unknown command or flag, a bad flag value (named
     as typed), a file that cannot be read or parsed

Output: commands that print data take -o text (the default), -o json or
-o yaml. The commands that talk to the admin API find it in --admin,
LANES_ADMIN or the admin-addr file of a local 'lanes up' (--data-dir, default
.lanes), and their token in --token, --token-file, LANES_TOKEN,
LANES_TOKEN_FILE or its admin-token file. Other users of the machine see
flags in ps: give a token in a variable or a file.

Shell completion: lanes completion bash|zsh|fish|powershell prints a script,
for example: source <(lanes completion bash)`,
		Version:       version(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("lanes {{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newSimulate(), newUp(stderr), newDemo(stderr), newLs(), newPolicy(), newRoute(), newDev(), newSidecar(), newToken(), newLane(), newFork(), newVet(), newTrace(), newVersion())
	return root
}
