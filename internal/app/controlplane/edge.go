package controlplane

import (
	"github.com/lanesdev/lanes/internal/app/gateway"
)

// defaultEdge is the gateway of `lanes up`: internal/app/gateway.
var defaultEdge EdgeFactory = func(cfg EdgeConfig) (Edge, error) {
	return gateway.New(gateway.Config{
		Engine:         cfg.Engine,
		Routes:         cfg.Routes,
		Domain:         cfg.Domain,
		TrustedProxies: cfg.TrustedProxies,
		Claims:         cfg.Claims,
		Zone:           cfg.Zone,
		Logger:         cfg.Logger,
		Registerer:     cfg.Registerer,
	})
}
