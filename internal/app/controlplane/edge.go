package controlplane

import (
	"github.com/lanesdev/lanes/internal/app/gateway"
)

// defaultEdge is the gateway of `lanes up`: internal/app/gateway.
var defaultEdge EdgeFactory = func(cfg EdgeConfig) (Edge, error) {
	routes := make([]gateway.Route, 0, len(cfg.Routes))
	for _, r := range cfg.Routes {
		routes = append(routes, gateway.Route{Host: r.Host, PathPrefix: r.Prefix, Service: r.Service})
	}
	return gateway.New(gateway.Config{
		Engine:         cfg.Engine,
		Routes:         routes,
		Domain:         cfg.Domain,
		TrustedProxies: cfg.TrustedProxies,
		Claims:         cfg.Claims,
		Zone:           cfg.Zone,
		Logger:         cfg.Logger,
		Registerer:     cfg.Registerer,
	})
}
