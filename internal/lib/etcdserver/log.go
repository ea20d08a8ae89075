package etcdserver

import (
	"context"
	"log/slog"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore is a zapcore.Core that hands etcd's log entries to a slog.Logger,
// so that the embedded member logs like the rest of lanes. While quiet is
// set (during Close) it drops everything: etcd reports its own shutdown
// ("http: Server closed", "use of closed network connection") as errors.
type slogCore struct {
	log   *slog.Logger
	level zapcore.Level
	attrs []slog.Attr
	quiet *atomic.Bool
}

func newZapLogger(log *slog.Logger, level zapcore.Level, quiet *atomic.Bool) *zap.Logger {
	return zap.New(&slogCore{log: log, level: level, quiet: quiet})
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.level && !c.quiet.Load() }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	cc := *c
	cc.attrs = append(append([]slog.Attr(nil), c.attrs...), attrs(fields)...)
	return &cc
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	if c.quiet.Load() {
		return nil
	}
	var lvl slog.Level
	switch {
	case e.Level >= zapcore.ErrorLevel:
		lvl = slog.LevelError
	case e.Level == zapcore.WarnLevel:
		lvl = slog.LevelWarn
	case e.Level == zapcore.InfoLevel:
		lvl = slog.LevelInfo
	default:
		lvl = slog.LevelDebug
	}
	as := append(append([]slog.Attr{slog.String("component", "etcd")}, c.attrs...), attrs(fields)...)
	if e.LoggerName != "" {
		as = append(as, slog.String("logger", e.LoggerName))
	}
	c.log.LogAttrs(context.Background(), lvl, e.Message, as...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

func attrs(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for _, f := range fields { // keep the order etcd gave
		if v, ok := enc.Fields[f.Key]; ok {
			out = append(out, slog.Any(f.Key, v))
			delete(enc.Fields, f.Key)
		}
	}
	return out
}
