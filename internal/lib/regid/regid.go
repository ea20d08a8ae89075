// Package regid is the registration id, written once: the etcd lease that holds an instance,
// written in hex. etcdstore and the admin API write and read it (Format, Parse); a client of the
// admin API learns the id of its own registration from the lease it keeps (Of), to attach a
// client-IP claim to it.
package regid

import (
	"strconv"

	"github.com/lanesdev/lanes/registry"
)

// Format writes a lease id as registrations show it: in hex.
func Format[ID ~int64](id ID) string { return strconv.FormatInt(int64(id), 16) }

// Parse reads a lease id written by Format; false when v is not one (a lease id is positive).
func Parse[ID ~int64](v string) (ID, bool) {
	n, err := strconv.ParseInt(v, 16, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return ID(n), true
}

// Holder is the registry.Keeper of a backend whose leases have a registration id: it returns the
// id of the registration that currently holds the instance.
type Holder interface {
	Registration() string
}

// Of returns the registration id that holds the instance of l, a lease returned by the admin
// API's registry (adminclient.Registry.Register), or "" for another lease. It changes when the
// instance had to be registered again; client-IP claims (adminclient.Client.Claim) are attached
// to it.
func Of(l registry.Lease) string {
	if kl, ok := l.(*registry.KeptLease); ok {
		if h, ok := kl.Keeper().(Holder); ok {
			return h.Registration()
		}
	}
	return ""
}
