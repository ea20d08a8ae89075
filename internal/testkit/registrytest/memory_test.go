package registrytest_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/registrytest"
	"github.com/lanesdev/lanes/registry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestMemory(t *testing.T) {
	registrytest.Run(t, func(*testing.T) registry.Registry { return registry.NewMemory() })
}
