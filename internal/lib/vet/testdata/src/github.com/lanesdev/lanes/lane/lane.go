// Package lane is a stub of lanes' lane package for the analyzers' tests.
package lane

import "context"

func Detach(ctx context.Context) context.Context                { return ctx }
func WithLane(ctx context.Context, name string) context.Context { return ctx }
func FromContext(ctx context.Context) string                    { return "" }
