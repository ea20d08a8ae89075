// Package grpc is a stub of grpc-go for the analyzers' tests.
package grpc

import "context"

type ClientConn struct{}
type DialOption interface{}

func NewClient(target string, opts ...DialOption) (*ClientConn, error) { return nil, nil }
func Dial(target string, opts ...DialOption) (*ClientConn, error)      { return nil, nil }
func DialContext(ctx context.Context, target string, opts ...DialOption) (*ClientConn, error) {
	return nil, nil
}

type ServerStream interface {
	SetHeader(md map[string][]string) error
	Context() context.Context
	SendMsg(m any) error
	RecvMsg(m any) error
}
