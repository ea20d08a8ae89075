package kubestore

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lanesdev/lanes/internal/lib/regopen"
)

// scheme is the scheme of LANES_REGISTRY that the package links in.
const scheme = "k8s"

// envServiceHost is set by the kubelet in every pod: a process that finds
// it and no LANES_REGISTRY follows its cluster.
const envServiceHost = "KUBERNETES_SERVICE_HOST"

// URL is a parsed k8s:// LANES_REGISTRY.
type URL struct {
	// Options of the Store: ?namespace= (repeated, or comma-separated;
	// all namespaces when absent), ?register-namespace=, and ?register=
	// (pod: write nothing, the pod's endpoints are the registration;
	// slice: write a managed EndpointSlice and its Lease).
	Options Options
	// Context is ?context=: the kubeconfig context, outside a cluster.
	Context string
	// Kubeconfig is ?kubeconfig=: the kubeconfig file, which is used even
	// in a pod (default: the pod's service account in a pod, else
	// KUBECONFIG, else ~/.kube/config).
	Kubeconfig string
	// Policy is ?policy=: the namespace whose published policy
	// (PolicyConfigMap) the engine follows, or "off" for none (default:
	// the pod's namespace in a pod, else the first namespace followed,
	// else "default"; see PolicyNamespace).
	Policy string
}

// ParseURL reads a k8s:// LANES_REGISTRY: k8s:// alone follows every
// namespace, registers in a pod's endpoints when in a pod (getenv finds
// KUBERNETES_SERVICE_HOST) and in managed EndpointSlices in "default"
// otherwise. The connection is the pod's service account in a pod, else
// the kubeconfig (KUBECONFIG, else ~/.kube/config) and its current context.
// An error names the option and the value as written.
func ParseURL(raw string, getenv func(string) string) (URL, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var out URL
	u, err := url.Parse(raw)
	if err != nil || !strings.EqualFold(u.Scheme, scheme) {
		return out, fmt.Errorf("want k8s://[?namespace=a,b][&register-namespace=ns][&register=pod|slice][&context=name][&kubeconfig=path][&policy=namespace|off]")
	}
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.User != nil || u.Fragment != "" {
		return out, fmt.Errorf("k8s:// takes no host or path (%q): the cluster is the pod's, or the kubeconfig's", strings.TrimPrefix(raw, u.Scheme+"://"))
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return out, fmt.Errorf("query %q: %v", u.RawQuery, err)
	}
	out.Options.InPod = getenv(envServiceHost) != ""
	for k, vs := range q {
		switch k {
		case "namespace":
			for _, v := range vs {
				for _, ns := range strings.Split(v, ",") {
					ns = strings.TrimSpace(ns)
					if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
						return out, fmt.Errorf("namespace %q: %s", ns, errs[0])
					}
					out.Options.Namespaces = append(out.Options.Namespaces, ns)
				}
			}
		case "register-namespace":
			ns := q.Get(k)
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return out, fmt.Errorf("register-namespace %q: %s", ns, errs[0])
			}
			out.Options.RegisterNamespace = ns
		case "register":
			switch v := q.Get(k); v {
			case "pod":
				out.Options.InPod = true
			case "slice":
				out.Options.InPod = false
			default:
				return out, fmt.Errorf("register %q: want pod or slice", v)
			}
		case "context":
			out.Context = q.Get(k)
		case "kubeconfig":
			out.Kubeconfig = q.Get(k)
		case "policy":
			v := q.Get(k)
			if errs := validation.IsDNS1123Label(v); v != "off" && len(errs) > 0 {
				return out, fmt.Errorf("policy %q: want a namespace, or off: %s", v, errs[0])
			}
			out.Policy = v
		default:
			return out, fmt.Errorf("unknown option %q: want namespace, register-namespace, register, context, kubeconfig or policy", k)
		}
	}
	return out, nil
}

// saNamespace is where the kubelet writes the namespace of a pod.
const saNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// PolicyNamespace returns the namespace whose published policy the Store
// of u follows ("" for none): ?policy=, else the pod's namespace in a pod
// (its service account's), else the first namespace followed, else
// "default".
func (u URL) PolicyNamespace() string {
	switch {
	case u.Policy == "off":
		return ""
	case u.Policy != "":
		return u.Policy
	}
	if u.Options.InPod {
		if b, err := os.ReadFile(saNamespace); err == nil {
			if ns := strings.TrimSpace(string(b)); validation.IsDNS1123Label(ns) == nil {
				return ns
			}
		}
	}
	if len(u.Options.Namespaces) > 0 {
		return u.Options.Namespaces[0]
	}
	return "default"
}

// RESTConfig returns the connection of u: its kubeconfig file when it
// names one; else the pod's service account when getenv finds
// KUBERNETES_SERVICE_HOST; else the kubeconfig of KUBECONFIG, else
// ~/.kube/config.
func (u URL) RESTConfig(getenv func(string) string) (*rest.Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if getenv(envServiceHost) != "" && u.Context == "" && u.Kubeconfig == "" {
		return rest.InClusterConfig()
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kc := getenv(clientcmd.RecommendedConfigPathEnvVar); kc != "" {
		rules.ExplicitPath = kc
	}
	if u.Kubeconfig != "" {
		rules.ExplicitPath = u.Kubeconfig
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: u.Context}).ClientConfig()
}

func init() {
	regopen.Register(scheme, regopen.Backend{
		Check: func(raw string) error { _, err := ParseURL(raw, nil); return err },
		InCluster: func(getenv func(string) string) (string, bool) {
			return scheme + "://", getenv(envServiceHost) != ""
		},
		Open: func(ctx context.Context, raw string, getenv func(string) string, log *slog.Logger) (regopen.Opened, error) {
			u, err := ParseURL(raw, getenv)
			if err != nil {
				return regopen.Opened{}, err
			}
			cfg, err := u.RESTConfig(getenv)
			if err != nil {
				return regopen.Opened{}, fmt.Errorf("no connection to a cluster: %w", err)
			}
			u.Options.Logger = log
			u.Options.PolicyNamespace = u.PolicyNamespace()
			st, err := Open(ctx, cfg, u.Options)
			if err != nil {
				return regopen.Opened{}, err
			}
			return regopen.Opened{Registry: st, Policy: st.Policy(), Close: st.Close, Via: "Kubernetes API"}, nil
		},
	})
}
