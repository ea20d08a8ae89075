// Package jetstream is a stub of nats.go's jetstream package for the analyzers' tests.
package jetstream

import (
	"context"

	nats "github.com/nats-io/nats.go"
)

type PubAck struct{}

type JetStream interface {
	Publish(ctx context.Context, subject string, payload []byte) (*PubAck, error)
	PublishMsg(ctx context.Context, msg *nats.Msg) (*PubAck, error)
}
