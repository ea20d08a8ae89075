package laneskafka

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Client is a service's Kafka brokers together with the registry and the
// routing engine that its consumers register in and follow: it makes the
// service's publishers and consumers. lanesenv.Open makes one from
// LANES_KAFKA (Env.Kafka). A nil *Client makes nothing: each method returns
// ErrNoConnection.
type Client struct {
	// Producer is the client that publishers share.
	Producer *kgo.Client
	// Opts are the options of every client made: the seed brokers, and
	// anything else (TLS, SASL) the service set.
	Opts []kgo.Opt
	// Registry and Engine are what Consumer gives a ConsumerConfig that
	// does not set them.
	Registry registry.Registry
	Engine   *routing.Engine
}

// NewClient returns a Client on the brokers of opts (kgo.SeedBrokers is
// required), for consumers that register in reg and follow engine. Close
// closes its producer.
func NewClient(reg registry.Registry, engine *routing.Engine, opts ...kgo.Opt) (*Client, error) {
	switch {
	case reg == nil:
		return nil, fmt.Errorf("%w: no registry", ErrInvalidOption)
	case engine == nil:
		return nil, fmt.Errorf("%w: no routing engine", ErrInvalidOption)
	}
	p, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	return &Client{Producer: p, Opts: opts, Registry: reg, Engine: engine}, nil
}

// Close closes the producer.
func (c *Client) Close() {
	if c != nil {
		c.Producer.Close()
	}
}

// Publisher returns a publisher of topic on the shared producer.
func (c *Client) Publisher(topic string, opts ...PublisherOpt) (*Publisher, error) {
	if c == nil {
		return nil, ErrNoConnection
	}
	return NewPublisher(c.Producer, topic, opts...)
}

// Consumer starts a consumer (NewConsumer) whose ClientOpts, Registry and
// Engine are the Client's unless cfg sets them.
func (c *Client) Consumer(ctx context.Context, cfg ConsumerConfig, h Handler, opts ...ConsumerOpt) (*Consumer, error) {
	if c == nil {
		return nil, ErrNoConnection
	}
	if cfg.ClientOpts == nil {
		cfg.ClientOpts = c.Opts
	}
	if cfg.Registry == nil {
		cfg.Registry = c.Registry
	}
	if cfg.Engine == nil {
		cfg.Engine = c.Engine
	}
	return NewConsumer(ctx, cfg, h, opts...)
}
