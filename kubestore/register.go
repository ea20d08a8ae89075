package kubestore

// The lease protocol of a registration from outside any pod. It is
// registry.KeptLease's protocol (renew, make again when lost, leave an
// instance another registration took, release), written here once for the
// Kubernetes API:
//
//   - Each registration has a token of its own and a coordination.k8s.io
//     Lease named after its slice and its token, holderIdentity the token,
//     leaseDurationSeconds its TTL. It renews the Lease (renewTime) every
//     third of the TTL. The Lease is written first.
//   - The instance is an EndpointSlice named after its service and id
//     (sliceName), so that registering an id again writes the same slice:
//     the newest registration overwrites it, naming its own token and
//     Lease. Watchers show the instance while the Lease that the slice
//     names exists, holds the slice's token and was renewed within its
//     duration. The old registration's Lease stays its owner's to delete:
//     a registration replaced by another sees it in its Store's view and
//     stops renewing (registry.ErrTakenOver), and its Update and Close no
//     longer touch the slice (every write of a slice is conditional on the
//     resourceVersion read with its token).
//   - Expiry is judged as client-go's leader election judges it: by the
//     watcher's own clock, from when it saw the Lease change, never by the
//     renewTime that another machine's clock wrote. While a Store's Lease
//     informer cannot reach the API server nothing expires in its view, and
//     every Lease counts afresh once it can (and the routing engine holds
//     what is lost just after: registry.Outages).
//   - Whoever sees a registration expired deletes its slice and its Lease,
//     after a random delay under 2s, each deletion conditional on the
//     version it saw (so a renewal in between wins and only one deletion
//     succeeds). A slice whose Lease never appears is an orphan, deleted
//     once its TTL and that delay have passed since it was first seen.
//   - A registration that finds its Lease deleted (the API server answered:
//     registry.ErrGone) makes it and its slice again at once; one that
//     cannot reach the API server keeps trying, and gives the registration
//     up for lost once the TTL has passed since its last renewal.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/lanesdev/lanes/registry"
)

// Register implements registry.Registry. In a pod (Options.InPod) it
// writes nothing and returns a lease that holds until Close; otherwise it
// writes the instance's EndpointSlice and its Lease, and returns once its
// own Store shows the instance.
func (s *Store) Register(ctx context.Context, inst registry.Instance, ttl time.Duration) (registry.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ttl < 0 {
		return nil, &registry.FieldError{Field: "ttl", Value: ttl.String(), Msg: "must not be negative"}
	}
	if ttl == 0 {
		ttl = registry.DefaultTTL
	}
	ttl = max(ttl.Round(time.Second), time.Second) // a Lease counts in seconds
	inst, err := registry.Normalize(inst)
	if err != nil {
		return nil, err
	}
	if s.g.Closed() {
		return nil, registry.ErrClosed
	}
	if s.o.InPod {
		return registry.NewKeptLease(s.g.Context(), inst, podKeeper{}, s.log), nil
	}
	k := &keeper{s: s, ns: s.o.RegisterNamespace, ttl: ttl, token: token(), slice: sliceName(inst.Service, inst.ID), svc: inst.Service, id: inst.ID}
	k.lease = k.slice + "-" + k.token[:10]
	if err := k.write(ctx, inst); err != nil {
		k.dropLease()
		return nil, err
	}
	l := registry.NewKeptLease(s.g.Context(), inst, k, s.log)
	if !l.Start(s.g.Go) {
		return nil, registry.ErrClosed
	}
	return l, nil
}

// podKeeper keeps the registration of a process in a pod: there is none to
// keep, the pod's endpoints are.
type podKeeper struct{}

func (podKeeper) Keep(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}
func (podKeeper) Restore(context.Context, registry.Instance) error { return nil }
func (podKeeper) Put(context.Context, registry.Instance) error     { return nil }
func (podKeeper) Release(context.Context) error                    { return nil }

func token() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sliceName is the EndpointSlice of service/id: a readable part of the
// service's name, and a hash of both.
func sliceName(service, id string) string {
	sum := sha256.Sum256([]byte(service + "\x00" + id))
	var b strings.Builder
	for _, c := range strings.ToLower(service) {
		if b.Len() == 40 {
			break
		}
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteRune(c)
		}
	}
	return "lanes-" + strings.Trim(b.String(), "-") + "-" + hex.EncodeToString(sum[:8])
}

// keeper is one registration: a registry.Keeper.
type keeper struct {
	s     *Store
	ns    string
	ttl   time.Duration
	token string
	slice string // the EndpointSlice's name
	lease string // the Lease's name
	svc   string
	id    string
}

func (k *keeper) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, min(requestTimeout, max(k.ttl/3, time.Second)))
}

// write makes (or renews) the registration's Lease, then writes the slice
// of inst over whatever holds it, and waits for the Store to show it.
func (k *keeper) write(ctx context.Context, inst registry.Instance) error {
	if err := k.renew(ctx, true); err != nil {
		return err
	}
	want := k.sliceObject(inst)
	slices := k.s.kube.DiscoveryV1().EndpointSlices(k.ns)
	var rv string
	for {
		c, cancel := k.call(ctx)
		got, err := slices.Create(c, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var cur *discoveryv1.EndpointSlice
			if cur, err = slices.Get(c, k.slice, metav1.GetOptions{}); err == nil {
				want.ResourceVersion = cur.ResourceVersion
				got, err = slices.Update(c, want, metav1.UpdateOptions{})
				want.ResourceVersion = ""
			}
		}
		cancel()
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue // written or removed meanwhile: again
		}
		if err != nil {
			return fmt.Errorf("kubestore: write EndpointSlice %s/%s: %w", k.ns, k.slice, err)
		}
		rv = got.ResourceVersion
		break
	}
	return k.seen(ctx, parseRV(rv))
}

// seen waits until the Store shows the registration's slice at rv or
// later, or shows another registration of the instance.
func (k *keeper) seen(ctx context.Context, rv uint64) error {
	v := k.s.view
	ok := v.waitFor(ctx.Done(), func() bool {
		sh := v.shownAt(k.svc, k.id)
		return sh != nil && (sh.holder != k.token || sh.sliceRV >= rv)
	})
	if ok {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kubestore: the registration of %s/%s was written, but not seen by the Store's informers in time: %w", k.svc, k.id, err)
	}
	return registry.ErrClosed
}

// renew writes the registration's Lease: creates it when create is set and
// it is missing; else a missing Lease is registry.ErrGone.
func (k *keeper) renew(ctx context.Context, create bool) error {
	leases := k.s.kube.CoordinationV1().Leases(k.ns)
	secs := int32(k.ttl / time.Second)
	now := metav1.NewMicroTime(time.Now())
	c, cancel := k.call(ctx)
	defer cancel()
	cur, err := leases.Get(c, k.lease, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && create:
		_, err = leases.Create(c, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: k.lease, Labels: map[string]string{labelLeaseManagedBy: managedBy}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &k.token, LeaseDurationSeconds: &secs,
				AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: Lease %s/%s deleted", registry.ErrGone, k.ns, k.lease)
	case err == nil:
		cur.Spec.RenewTime = &now
		cur.Spec.LeaseDurationSeconds = &secs
		_, err = leases.Update(c, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("kubestore: renew Lease %s/%s: %w", k.ns, k.lease, err)
	}
	return nil
}

func (k *keeper) sliceObject(inst registry.Instance) *discoveryv1.EndpointSlice {
	raw, _ := json.Marshal(inst)
	labels := map[string]string{labelManagedBy: managedBy}
	if len(validation.IsValidLabelValue(inst.Service)) == 0 {
		labels[labelService] = inst.Service
	}
	if inst.Lane != "" && len(validation.IsValidLabelValue(inst.Lane)) == 0 {
		labels[LabelLane] = inst.Lane
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: k.slice, Labels: labels, Annotations: map[string]string{
			annotationInstance: string(raw), annotationHolder: k.token, annotationLease: k.lease,
			annotationTTL: k.ttl.String(),
		}},
		AddressType: discoveryv1.AddressTypeFQDN,
	}
	host, p, _ := net.SplitHostPort(inst.Addr)
	port, _ := strconv.Atoi(p)
	if ip := net.ParseIP(host); ip != nil {
		es.AddressType = discoveryv1.AddressTypeIPv4
		if ip.To4() == nil {
			es.AddressType = discoveryv1.AddressTypeIPv6
		}
		if ip.IsLoopback() || ip.IsUnspecified() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() {
			// The API server refuses these in an endpoint (a process on
			// a laptop registers 127.0.0.1): the instance is in the
			// annotation alone.
			return es
		}
	} else if len(validation.IsFullyQualifiedDomainName(nil, host)) > 0 {
		return es // a name without a dot, such as localhost: likewise
	}
	ready, serving, terminating := !inst.Drain, true, inst.Drain
	ep := discoveryv1.Endpoint{Addresses: []string{host},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
	if inst.Zone != "" {
		ep.Zone = &inst.Zone
	}
	es.Endpoints = []discoveryv1.Endpoint{ep}
	port32, proto := int32(port), corev1.ProtocolTCP
	es.Ports = []discoveryv1.EndpointPort{{Port: &port32, Protocol: &proto}}
	return es
}

// Keep implements registry.Keeper: it renews the Lease every third of the
// TTL, and returns when the Lease is gone, when the TTL has passed since
// the last renewal, or when the Store shows another registration of the
// instance.
func (k *keeper) Keep(ctx context.Context) error {
	v := k.s.view
	last := time.Now()
	every := k.ttl / 3
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		v.mu.Lock()
		sh, ch := v.shownAt(k.svc, k.id), v.changed
		v.mu.Unlock()
		switch {
		case sh == nil:
			return fmt.Errorf("%w: no longer shown", registry.ErrGone)
		case sh.holder != k.token:
			return fmt.Errorf("%w: registered again by another registration", registry.ErrGone)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
			continue
		case <-t.C:
		}
		err := k.renew(ctx, false)
		switch {
		case err == nil:
			last = time.Now()
			t.Reset(every)
		case errors.Is(err, registry.ErrGone):
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			k.s.outages.Mark(time.Now())
			if time.Since(last) >= k.ttl {
				return fmt.Errorf("not renewed for %s: %w", k.ttl, err)
			}
			t.Reset(min(time.Second, every))
		}
	}
}

// Restore implements registry.Keeper: it leaves the instance to another
// registration that the Store shows, else writes the Lease and the slice
// again.
func (k *keeper) Restore(ctx context.Context, inst registry.Instance) error {
	v := k.s.view
	v.mu.Lock()
	sh := v.shownAt(inst.Service, inst.ID)
	v.mu.Unlock()
	if sh != nil && sh.holder != k.token {
		return registry.ErrTakenOver
	}
	return k.write(ctx, inst)
}

// Put implements registry.Keeper: it rewrites the slice if it still holds
// this registration.
func (k *keeper) Put(ctx context.Context, inst registry.Instance) error {
	slices := k.s.kube.DiscoveryV1().EndpointSlices(k.ns)
	for {
		c, cancel := k.call(ctx)
		cur, err := slices.Get(c, k.slice, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cancel()
			return nil
		}
		if err == nil && cur.Annotations[annotationHolder] != k.token {
			cancel()
			return nil
		}
		var got *discoveryv1.EndpointSlice
		if err == nil {
			want := k.sliceObject(inst)
			want.ResourceVersion = cur.ResourceVersion
			got, err = slices.Update(c, want, metav1.UpdateOptions{})
		}
		cancel()
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("kubestore: update EndpointSlice %s/%s: %w", k.ns, k.slice, err)
		}
		return k.seen(ctx, parseRV(got.ResourceVersion))
	}
}

// Release implements registry.Keeper: it deletes the slice if it still
// holds this registration, then the registration's Lease, and waits until
// the Store no longer shows the registration.
func (k *keeper) Release(ctx context.Context) error {
	slices := k.s.kube.DiscoveryV1().EndpointSlices(k.ns)
	for {
		c, cancel := k.call(ctx)
		cur, err := slices.Get(c, k.slice, metav1.GetOptions{})
		if err == nil && cur.Annotations[annotationHolder] == k.token {
			rv := cur.ResourceVersion
			err = slices.Delete(c, k.slice, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		}
		cancel()
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("kubestore: delete EndpointSlice %s/%s: %w", k.ns, k.slice, err)
		}
		break
	}
	if err := k.dropLease(); err != nil {
		return err
	}
	v := k.s.view
	v.waitFor(ctx.Done(), func() bool {
		sh := v.shownAt(k.svc, k.id)
		return sh == nil || sh.holder != k.token
	})
	return nil
}

// dropLease deletes the registration's Lease.
func (k *keeper) dropLease() error {
	c, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	err := k.s.kube.CoordinationV1().Leases(k.ns).Delete(c, k.lease, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubestore: delete Lease %s/%s: %w", k.ns, k.lease, err)
	}
	return nil
}
