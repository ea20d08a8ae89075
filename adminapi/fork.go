package adminapi

import "time"

// ForkRequest asks for a lane's copy of a Kubernetes Deployment (POST
// /v1/forks): the control plane's Kubernetes controller makes the copy,
// labelled into the lane, and deletes it when the fork is deleted, its TTL
// passes or the lane expires (docs/kubernetes.md).
type ForkRequest struct {
	// Lane is the lane the copy serves. A lane token forks only into its
	// own lane.
	Lane string `json:"lane"`
	// Namespace of the Deployment; "" is the controller's namespace.
	Namespace string `json:"namespace,omitempty"`
	// Deployment is the name of the Deployment to copy.
	Deployment string `json:"deployment"`
	// Container names the container that Image and Env change; "" is the
	// first one.
	Container string `json:"container,omitempty"`
	// Image, when set, replaces the container's image in the copy.
	Image string `json:"image,omitempty"`
	// Env sets variables of the container in the copy.
	Env map[string]string `json:"env,omitempty"`
	// Replicas of the copy: 1 when 0, at most the control plane's bound.
	Replicas int `json:"replicas,omitempty"`
	// TTL, when set, ends the fork that long after it is made.
	TTL Duration `json:"ttl,omitempty"`
	// ConfigMaps copies the ConfigMaps the Deployment's pods use into the
	// lane, so that the copy may change them without touching the
	// baseline's.
	ConfigMaps bool `json:"configmaps,omitempty"`
}

// Fork is a lane's copy of a Deployment as the control plane keeps it
// (POST and GET /v1/forks).
type Fork struct {
	ForkRequest
	// Name is the copy's name: the Deployment's, suffixed with the lane.
	Name    string     `json:"name"`
	Created time.Time  `json:"created"`
	Expires *time.Time `json:"expires,omitempty"`
	// By is the credential that made it: "admin" or a token's id.
	By string `json:"by"`
	// Status is the Kubernetes controller's last word on the copy: "made",
	// or why it is not; "" until the controller has seen the fork.
	Status string `json:"status,omitempty"`
}

// ForkName is the name of lane's copy of the Deployment deployment.
func ForkName(deployment, lane string) string { return deployment + "-" + lane }
