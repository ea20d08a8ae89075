package registry

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"strconv"
	"strings"
)

// The environment variables that ApplyEnv reads, so that a deploy platform
// can place an instance in a lane without changing its code.
const (
	EnvID      = "LANES_ID"      // instance id; default: host-port plus a random suffix
	EnvLane    = "LANES_LANE"    // lane; default: the baseline
	EnvZone    = "LANES_ZONE"    // zone
	EnvWeight  = "LANES_WEIGHT"  // weight, 0 drains; default 100
	EnvVersion = "LANES_VERSION" // build version
	EnvHost    = "LANES_HOST"    // host name; default: os.Hostname
	EnvAddr    = "LANES_ADDR"    // the address to advertise, host:port
	EnvLabels  = "LANES_LABELS"  // labels as "k=v,k=v"
)

// ApplyEnv fills every field of in that is not set from the LANES_*
// variables read through getenv (os.Getenv when nil). Fields set in code win
// over the environment. It then fills defaults: Host from os.Hostname, and an
// ID made of the host, the port and a random suffix. An unusable value is a
// *FieldError naming the variable and the value.
func ApplyEnv(in Instance, getenv func(string) string) (Instance, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	set := func(field *string, env string) {
		if *field == "" {
			*field = strings.TrimSpace(getenv(env))
		}
	}
	set(&in.ID, EnvID)
	set(&in.Lane, EnvLane)
	set(&in.Zone, EnvZone)
	set(&in.Version, EnvVersion)
	set(&in.Host, EnvHost)
	set(&in.Addr, EnvAddr)
	if w := strings.TrimSpace(getenv(EnvWeight)); w != "" && in.Weight == 0 && !in.Drain {
		n, err := strconv.Atoi(w)
		if err != nil || n < 0 || n > MaxWeight {
			return in, &FieldError{Field: EnvWeight, Value: w, Msg: "must be a whole number within 0..1000000"}
		}
		in.Weight = n
		in.Drain = n == 0
	}
	if l := strings.TrimSpace(getenv(EnvLabels)); l != "" {
		labels := make(map[string]string, len(in.Labels))
		for _, kv := range strings.Split(l, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || strings.TrimSpace(k) == "" {
				return in, &FieldError{Field: EnvLabels, Value: l, Msg: `want "key=value,key=value"`}
			}
			labels[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
		for k, v := range in.Labels { // code wins
			labels[k] = v
		}
		in.Labels = labels
	}
	if in.Host == "" {
		in.Host = LocalHost(func(string) string { return "" })
	}
	if in.ID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		port := "0"
		if _, p, err := net.SplitHostPort(in.Addr); err == nil {
			port = p
		}
		in.ID = sanitize(in.Host) + "-" + port + "-" + hex.EncodeToString(b[:])
	}
	return in, nil
}

// LocalHost is the host of this process, as its instances register it:
// LANES_HOST read through getenv (os.Getenv when nil), else the machine's
// host name. Callers pass it to the routing engine (routing.Request.Host) for
// the same-host rule, so that a caller and the instances on its machine agree
// on the name.
func LocalHost(getenv func(string) string) string {
	if getenv == nil {
		getenv = os.Getenv
	}
	if h := strings.TrimSpace(getenv(EnvHost)); h != "" {
		return h
	}
	h, _ := os.Hostname()
	return h
}

// sanitize keeps the characters an instance id may have.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	if len(b) == 0 || len(b) > 200 {
		return "instance"
	}
	return string(b)
}
