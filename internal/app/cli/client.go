package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/app/controlplane"
	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/registry"
)

// clientFlags are the flags of every command that talks to the admin API.
type clientFlags struct {
	admin     string
	token     string
	tokenFile string
	dataDir   string
	caFile    string
	// fields maps the request fields of the admin API that the command
	// fills from flags to those flags ("expires_in" -> "--in"), so that a
	// refusal names the flag as the user typed it.
	fields map[string]string
}

func (f *clientFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.admin, "admin", "", "address of the admin API (LANES_ADMIN; default: the one a 'lanes up' with this data directory recorded in <data-dir>/admin-addr, else "+adminclient.DefaultAddr+")")
	cmd.Flags().StringVar(&f.token, "token", "", "token (LANES_TOKEN; default: the admin token in <data-dir>/admin-token); other users see flags in ps: prefer LANES_TOKEN or --token-file")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "", "file holding the token (LANES_TOKEN_FILE)")
	cmd.Flags().StringVar(&f.caFile, "ca-file", "", "PEM file of the CA that an https:// admin API is verified with ("+adminclient.EnvCAFile+"; default: the system's roots)")
	cmd.Flags().StringVar(&f.dataDir, "data-dir", "", "data directory of a local 'lanes up', for its admin address and token (LANES_DATA_DIR; default .lanes)")
}

// apiClient is a client of the admin API with what the command knows of
// where its address and token came from, for messages.
type apiClient struct {
	*adminclient.Client
	addrFrom  string // "--admin", "LANES_ADMIN", the admin-addr file or "the default"
	tokenFrom string // "--token", "LANES_TOKEN" or the admin-token file
	tokenFile string // the admin-token file looked at when no token was given
	token     string
	fields    map[string]string
}

// client returns an admin API client: the address from --admin,
// LANES_ADMIN, the admin-addr file of the data directory or the default;
// the token from --token, LANES_TOKEN or the admin-token file of the data
// directory.
func (f *clientFlags) client() (*apiClient, error) {
	dir := firstOf(f.dataDir, getenv("LANES_DATA_DIR"), controlplane.Defaults().DataDir)
	c := &apiClient{fields: f.fields}
	addr := ""
	switch {
	case strings.TrimSpace(f.admin) != "":
		addr, c.addrFrom = f.admin, "--admin"
	case strings.TrimSpace(getenv(adminclient.EnvAdmin)) != "":
		addr, c.addrFrom = getenv(adminclient.EnvAdmin), adminclient.EnvAdmin
	default:
		path := filepath.Join(dir, controlplane.AdminAddrFile)
		if data, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(data)) != "" {
			addr, c.addrFrom = strings.TrimSpace(string(data)), path
		} else {
			addr, c.addrFrom = adminclient.DefaultAddr, "the default"
		}
	}
	tok := ""
	switch {
	case strings.TrimSpace(f.token) != "":
		tok, c.tokenFrom = f.token, "--token"
	case strings.TrimSpace(f.tokenFile) != "":
		t, err := readTokenFile("--token-file", f.tokenFile)
		if err != nil {
			return nil, err
		}
		tok, c.tokenFrom = t, f.tokenFile
	case strings.TrimSpace(getenv(adminclient.EnvToken)) != "":
		tok, c.tokenFrom = getenv(adminclient.EnvToken), adminclient.EnvToken
	case strings.TrimSpace(getenv(EnvTokenFile)) != "":
		t, err := readTokenFile(EnvTokenFile, getenv(EnvTokenFile))
		if err != nil {
			return nil, err
		}
		tok, c.tokenFrom = t, getenv(EnvTokenFile)
	default:
		path := filepath.Join(dir, controlplane.AdminTokenFile)
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		c.tokenFile = path
		if data, err := os.ReadFile(path); err == nil {
			tok, c.tokenFrom = strings.TrimSpace(string(data)), path
		}
	}
	ca, caFrom := f.caFile, "--ca-file"
	if strings.TrimSpace(ca) == "" {
		ca, caFrom = getenv(adminclient.EnvCAFile), adminclient.EnvCAFile
	}
	ac, err := adminclient.New(addr, tok, adminclient.WithCAFile(ca))
	if err != nil {
		from := c.addrFrom
		if ce := (*tlsfiles.CAError)(nil); errors.As(err, &ce) {
			from = caFrom
		}
		return nil, &exitError{code: ExitUsage, err: fmt.Errorf("%s: %v", from, err)}
	}
	c.Client, c.token = ac, tok
	return c, nil
}

// EnvTokenFile names the variable of a file that holds the token, as
// --token-file does.
const EnvTokenFile = "LANES_TOKEN_FILE"

// readTokenFile reads the token in the file path, given by from (a flag or
// a variable): its first line, trimmed.
func readTokenFile(from, path string) (string, error) {
	path = strings.TrimSpace(path)
	data, err := os.ReadFile(path)
	if err != nil {
		return "", &exitError{code: ExitUsage, err: fmt.Errorf("%s %q: %v", from, path, err)}
	}
	tok, _, _ := strings.Cut(strings.TrimSpace(string(data)), "\n")
	if tok = strings.TrimSpace(tok); tok == "" {
		return "", &exitError{code: ExitUsage, err: fmt.Errorf("%s %q: the file is empty", from, path)}
	}
	return tok, nil
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

// apiFailure turns an error of the admin API into the command's exit: a
// refused field that a flag filled is a usage error naming the flag (exit
// 2); other refusals and an unreachable control plane exit 1.
func apiFailure(c *apiClient, err error) error {
	var fe *registry.FieldError
	if errors.As(err, &fe) {
		if flag, ok := c.fields[fe.Field]; ok {
			return &exitError{code: ExitUsage, err: fmt.Errorf("%s %q: %s", flag, fe.Value, fe.Msg)}
		}
	}
	var ae *adminapi.Error
	if errors.As(err, &ae) {
		msg := ae.Message
		if flag, ok := c.fields[ae.Field]; ok && ae.Field != "" && (ae.Status == 400 || ae.Status == 422 || ae.Code == adminapi.CodeBadRequest) {
			val := ""
			if ae.Value != "" {
				val = fmt.Sprintf(" %q", ae.Value)
			}
			return &exitError{code: ExitUsage, err: fmt.Errorf("%s%s: %s", flag, val, stripField(msg, ae.Field))}
		}
		if ae.Code == adminapi.CodeUnauthorized {
			if c.tokenFrom == "" {
				msg = fmt.Sprintf("no token: none given with --token or %s, and %s was not found; run next to the 'lanes up' that created it (or give --data-dir), or give a token", adminclient.EnvToken, c.tokenFile)
			} else {
				msg += fmt.Sprintf(" (the token came from %s)", c.tokenFrom)
			}
		}
		return &exitError{code: ExitFail, err: errors.New(msg)}
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) {
		return &exitError{code: ExitFail, err: fmt.Errorf("cannot reach the admin API at %s (from %s; is 'lanes up' running? set --admin or LANES_ADMIN): %v", c.URL(), c.addrFrom, err)}
	}
	return &exitError{code: ExitFail, err: err}
}

// stripField removes a leading "field F: " that names the API's field.
func stripField(msg, field string) string {
	for _, p := range []string{"field " + field + ": ", field + ": "} {
		if m, ok := strings.CutPrefix(msg, p); ok {
			return m
		}
	}
	return msg
}

// callTimeout bounds one admin API call of a command.
const callTimeout = 30 * time.Second

// call runs fn with a client of the admin API and a context bounded by
// callTimeout, and closes the client after.
func (f *clientFlags) call(cmd *cobra.Command, fn func(ctx context.Context, c *apiClient) error) error {
	c, err := f.client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := callCtx(cmd)
	defer cancel()
	return fn(ctx, c)
}

func callCtx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	return context.WithTimeout(ctx, callTimeout)
}

func laneLabel(l string) string {
	if l == "" {
		return "(baseline)"
	}
	return l
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// selfCommand is how the user runs this program, for the commands it
// prints: "go run ./cmd/lanes" under go run, "lanes" when that is what the
// PATH finds, else the path of the executable.
func selfCommand() string {
	exe, err := os.Executable()
	if err != nil {
		return "lanes"
	}
	if strings.Contains(exe, string(filepath.Separator)+"go-build") {
		return "go run ./cmd/lanes"
	}
	if p, err := exec.LookPath("lanes"); err == nil {
		a, err1 := os.Stat(p)
		b, err2 := os.Stat(exe)
		if err1 == nil && err2 == nil && os.SameFile(a, b) {
			return "lanes"
		}
	}
	return exe
}

// checkLane fails (exit 1) when no instance, policy entry or client claim
// has lane name: a typo, which --force (doing what forced says) lets by.
func checkLane(ctx context.Context, c *apiClient, name, forced string) error {
	lanes, err := c.Lanes(ctx)
	if err != nil {
		return apiFailure(c, err)
	}
	for _, l := range lanes {
		if l.Name == name {
			return nil
		}
	}
	return &exitError{code: ExitFail, err: fmt.Errorf("no instance, policy entry or client claim has lane %q (lanes ls lists the lanes); --force %s anyway", name, forced)}
}

// checkService fails (exit 1) when no instance has registered service
// name: a typo, which --force (doing what forced says) lets by.
func checkService(ctx context.Context, c *apiClient, name, forced string) error {
	svcs, err := c.Services(ctx)
	if err != nil {
		return apiFailure(c, err)
	}
	for _, s := range svcs {
		if s.Name == name {
			return nil
		}
	}
	return noService(name, forced)
}

// noService is the error of a service name that no instance has registered.
func noService(name, forced string) error {
	return &exitError{code: ExitFail, err: fmt.Errorf("no service is named %q: no instance has registered it (lanes ls lists the services); --force %s anyway", name, forced)}
}
