package lanesnats

// The names that the tests check, which the package keeps to itself.
var (
	ConsumerName    = consumerName
	Token           = laneToken
	RegistryService = registryService
)
