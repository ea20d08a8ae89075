// Package logs builds the loggers of lanes: one format and one set of
// options for the control plane, the lanes commands and the services that
// join lanes through package lanesenv, so that their lines read alike.
package logs

import (
	"fmt"
	"github.com/lanesdev/lanes/lanestrace"
	"io"
	"log/slog"
	"strings"
)

// The formats a logger writes.
const (
	Text = "text" // slog's key=value lines
	JSON = "json" // one JSON object per line
)

// Levels lists the levels New accepts, for messages.
const Levels = "debug, info, warn or error"

// Formats lists the formats New accepts, for messages.
const Formats = "text or json"

// ParseLevel reads debug, info, warn or error ("" is info).
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, nil
	case "", "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("want %s", Levels)
}

// CheckFormat accepts text or json ("" is text).
func CheckFormat(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", Text, JSON:
		return nil
	}
	return fmt.Errorf("want %s", Formats)
}

// New returns a logger writing to w at level in format. Every record logged
// with a context carries the request's lane, trace id and span id
// (lanestrace.LogHandler). Bad values are errors saying what is wanted; the
// caller names the setting.
func New(w io.Writer, level, format string) (*slog.Logger, error) {
	l, err := ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("level %q: %w", level, err)
	}
	if err := CheckFormat(format); err != nil {
		return nil, fmt.Errorf("format %q: %w", format, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	if strings.EqualFold(strings.TrimSpace(format), JSON) {
		return slog.New(lanestrace.LogHandler(slog.NewJSONHandler(w, opts))), nil
	}
	return slog.New(lanestrace.LogHandler(slog.NewTextHandler(w, opts))), nil
}

// Must is New for settings already validated: a bad value falls back to
// info and text.
func Must(w io.Writer, level, format string) *slog.Logger {
	l, err := New(w, level, format)
	if err != nil {
		l, _ = New(w, "", "")
	}
	return l
}
