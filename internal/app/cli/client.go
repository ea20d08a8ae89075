package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/app/controlplane"
)

// clientFlags are the flags of every command that talks to the admin API.
type clientFlags struct {
	admin   string
	token   string
	dataDir string
}

func (f *clientFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.admin, "admin", "", "address of the admin API (LANES_ADMIN; default "+adminclient.DefaultAddr+")")
	cmd.Flags().StringVar(&f.token, "token", "", "token (LANES_TOKEN; default: the admin token in <data-dir>/admin-token)")
	cmd.Flags().StringVar(&f.dataDir, "data-dir", "", "data directory of a local 'lanes up', for its admin token (LANES_DATA_DIR; default .lanes)")
}

// client returns an admin API client: the address from --admin, LANES_ADMIN
// or the default; the token from --token, LANES_TOKEN or the admin-token
// file of the data directory.
func (f *clientFlags) client() (*adminclient.Client, error) {
	addr := firstOf(f.admin, getenv(adminclient.EnvAdmin), adminclient.DefaultAddr)
	tok := firstOf(f.token, getenv(adminclient.EnvToken))
	if tok == "" {
		dir := firstOf(f.dataDir, getenv("LANES_DATA_DIR"), controlplane.Defaults().DataDir)
		if data, err := os.ReadFile(filepath.Join(dir, controlplane.AdminTokenFile)); err == nil {
			tok = strings.TrimSpace(string(data))
		}
	}
	c, err := adminclient.New(addr, tok)
	if err != nil {
		return nil, &exitError{code: ExitUsage, err: err}
	}
	return c, nil
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

// apiFailure turns an error of the admin API into the command's exit.
func apiFailure(c *adminclient.Client, err error) error {
	var ae *adminapi.Error
	if errors.As(err, &ae) {
		msg := ae.Message
		if ae.Code == adminapi.CodeUnauthorized {
			msg += "; give a token with --token or LANES_TOKEN, or run where <data-dir>/admin-token is readable"
		}
		return &exitError{code: ExitFail, err: errors.New(msg)}
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) {
		return &exitError{code: ExitFail, err: fmt.Errorf("cannot reach the admin API at %s (is 'lanes up' running? set --admin or LANES_ADMIN): %v", c.URL(), err)}
	}
	return &exitError{code: ExitFail, err: err}
}

// callTimeout bounds one admin API call of a command.
const callTimeout = 30 * time.Second

// call runs fn with a client of the admin API and a context bounded by
// callTimeout, and closes the client after.
func (f *clientFlags) call(cmd *cobra.Command, fn func(ctx context.Context, c *adminclient.Client) error) error {
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
