// Command kvcluster-operator runs the KVCluster controller manager. Its subcommands are the
// programs the operator's image runs in the pods it creates (see subcommands.go):
//
//   - backup: a backup Job's program (scheduled, pre-upgrade and final backups);
//   - restore-fetch and restore-apply: a restoring member's two init containers;
//   - http-call: the deregistration Job's program when the deregistration is an HTTP request.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
	"github.com/kvcluster/kvcluster-operator/deploy"
)

func main() {
	if len(os.Args) > 1 {
		if run, ok := subcommands[os.Args[1]]; ok {
			os.Exit(run(os.Args[2:]))
		}
	}
	var (
		metricsAddr    = flag.String("metrics-bind-address", ":8443", "address the metrics endpoint binds to; 0 disables it")
		metricsSecure  = flag.Bool("metrics-secure", true, "serve metrics over HTTPS to clients the API server authenticates and authorizes (get on the non-resource URL /metrics); false: plain HTTP to anyone")
		metricsCertDir = flag.String("metrics-cert-dir", "", "directory of the metrics endpoint's tls.crt and tls.key, reloaded when they change (default: a self-signed certificate made at start)")
		probeAddr      = flag.String("health-probe-bind-address", ":8081", "address the /healthz and /readyz probes bind to")
		leaderElect    = flag.Bool("leader-elect", true, "elect a leader so that only one replica reconciles at a time")
		leaderNS       = flag.String("leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's own namespace)")
		etcdRepository = flag.String("etcd-repository", specs.DefaultEtcdRepository, "etcd image repository for KVClusters that do not set spec.repository (e.g. a mirror)")
		etcdTimeout    = flag.Duration("etcd-timeout", 5*time.Second, "bound of one query of an etcd cluster's members")
		backupImage    = flag.String("backup-image", os.Getenv("OPERATOR_IMAGE"), "the image backup, restore and deregistration Jobs run (default: $OPERATOR_IMAGE, else the image of the operator's own container, \"manager\", read from its pod; required outside a cluster)")
		operatorNS     = flag.String("operator-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the operator's own pods, which every cluster's NetworkPolicy admits to the client port (default: $POD_NAMESPACE, else the service account's; none outside the cluster)")
		operatorLabels = flag.String("operator-pod-labels", "app.kubernetes.io/name=kvcluster-operator", "labels of the operator's own pods (k=v,...), which every cluster's NetworkPolicy admits to the client port")
		pprofAddr      = flag.String("pprof-bind-address", "0", "address serving Go's profiles at /debug/pprof/ (e.g. 127.0.0.1:6060, for diagnosing CPU or memory use); 0 disables it")
		watch          = flag.String("watch-namespaces", "", "namespaces whose KVClusters the operator runs (ns[,ns...]), with Roles in each of them and a ClusterRole only for KVClusters and what is not namespaced (see the README); empty: every namespace")
		workers        = flag.Int("max-concurrent-reconciles", 32, "clusters reconciled at once, so a slow or unreachable cluster does not hold up the others (a reconcile mostly waits on the API server and etcd)")
	)
	opts := zap.Options{Development: false}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")
	if limit, ok, err := goMemoryLimit(os.Getenv("GOMEMLIMIT"), os.Getenv("MEMORY_LIMIT"), executableMapped); err != nil {
		log.Error(err, "cannot set Go's memory limit from the container's")
		os.Exit(1)
	} else if ok {
		debug.SetMemoryLimit(limit)
		log.Info("Go memory limit: 90 % of MEMORY_LIMIT less the executable's pages", "bytes", limit)
	}

	namespaces, err := watchNamespaces(*watch)
	if err != nil {
		log.Error(err, "--watch-namespaces")
		os.Exit(1)
	}
	metricsServing, err := metricsOptions(*metricsAddr, *metricsSecure, *metricsCertDir)
	if err != nil {
		log.Error(err, "cannot serve metrics")
		os.Exit(1)
	}
	scheme := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(scheme))
	must(kvv1.AddToScheme(scheme))
	config := ctrl.GetConfigOrDie()
	var leaving []string
	if len(namespaces) > 0 {
		// The cache waits for every watched namespace's objects, which a namespace deleted (or
		// re-created) without the operator's Role never gives: the manager would give up
		// starting. Of a namespace being deleted only the KVClusters are watched, to let them go.
		api, err := client.New(config, client.Options{Scheme: scheme})
		if err != nil {
			log.Error(err, "cannot reach the API server")
			os.Exit(1)
		}
		var left map[string]string
		if namespaces, leaving, left, err = watchableNamespaces(api, namespaces); err != nil {
			log.Error(err, "--watch-namespaces")
			os.Exit(1)
		}
		for ns, why := range left {
			log.Info("WARNING: a namespace of --watch-namespaces is not watched until the operator restarts", "namespace", ns, "why", why)
		}
		if len(leaving) > 0 {
			log.Info("namespaces being deleted: only their KVClusters are watched, to let them go", "namespaces", leaving)
		}
	}

	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsServing,
		HealthProbeBindAddress:  *probeAddr,
		PprofBindAddress:        *pprofAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        specs.LeaderElectionID,
		LeaderElectionNamespace: *leaderNS,
		// A stopped operator (a rolling update's SIGTERM) lets its Lease go once its reconciles
		// have ended, so the next one leads at once instead of waiting the Lease out (15 s) with
		// the fleet unwatched. Safe because main returns as soon as the manager does. (Reconciles
		// still running at the manager's 30 s shutdown timeout would not hold the Lease; in a pod
		// the kubelet kills the operator after 10 s, terminationGracePeriodSeconds, before it.)
		LeaderElectionReleaseOnCancel: true,
		Client:                        client.Options{FieldOwner: specs.FieldManager},
		Cache:                         controllers.CacheOptionsLeaving(namespaces, leaving),
	})
	if err != nil {
		log.Error(err, "cannot create the manager")
		os.Exit(1)
	}
	self, err := ownPod(*operatorNS, mgr.GetAPIReader())
	if err != nil {
		log.Error(err, "cannot read the operator's own pod")
		os.Exit(1)
	}
	operator, err := operatorPods(self, *operatorLabels)
	if err != nil {
		log.Error(err, "clusters' NetworkPolicies would refuse the operator")
		os.Exit(1)
	}
	jobs, err := jobImage(*backupImage, self)
	if err != nil {
		log.Error(err, "backup Jobs would have no image")
		os.Exit(1)
	}
	if own, _ := jobImage("", self); *backupImage != "" && own != "" && own != jobs {
		// An OPERATOR_IMAGE left from an older manifest would keep Jobs on an old operator.
		log.Info("WARNING: backup Jobs run the image --backup-image or OPERATOR_IMAGE gives, not the operator's own", "jobImage", jobs, "operatorImage", own)
	}
	// etcd clients stay open 10 s after their last request: across the reconciles of a cluster
	// being created, upgraded or repaired (5 s apart), not between a healthy cluster's polls (a
	// minute apart), which would hold every member's connection of every cluster for good. At most
	// 256 unused (an open client of one member holds about 30 KiB of heap: BenchmarkAnOpenClient),
	// 85 3-member clusters' worth; a larger burst dials again rather than grow the memory.
	etcd := members.EtcdClient{Timeout: *etcdTimeout, DialOptions: simulatedMembers(), Pool: members.NewPool(10*time.Second, 256)}
	r := &controllers.KVClusterReconciler{
		Client:         mgr.GetClient(),
		APIReader:      mgr.GetAPIReader(),
		Recorder:       mgr.GetEventRecorder(specs.FieldManager),
		Members:        etcd,
		Clock:          clock.RealClock{},
		EtcdRepository: *etcdRepository,
		BackupImage:    jobs,
		Workers:        *workers,
		Leaving:        leaving,
		Operator:       operator,
	}
	if operator.Namespace == "" {
		log.Info("running outside the cluster: clusters' NetworkPolicies name no operator pods, so the operator's traffic must come from a node")
	}
	if err := r.SetupWithManager(mgr); err != nil {
		log.Error(err, "cannot set up the KVCluster controller")
		os.Exit(1)
	}
	must(metrics.Registry.Register(controllers.NewClusterCollector(mgr.GetCache(), mgr.Elected())))
	must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	must(mgr.AddReadyzCheck("readyz", healthz.Ping))
	log.Info("starting manager", "etcdRepository", *etcdRepository, "leaderElection", *leaderElect, "jobImage", jobs, "watchNamespaces", namespaces)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager stopped with an error")
		os.Exit(1)
	}
}

// metricsOptions serve the operator's metrics. Secure (the default), over HTTPS to the clients
// the API server authenticates (TokenReview) and authorizes (SubjectAccessReview) to get
// /metrics, such as Prometheus with the kvcluster-metrics-reader ClusterRole; over HTTP/1.1 only,
// as HTTP/2 adds attack surface (stream resets) that a scrape does not need.
func metricsOptions(addr string, secure bool, certDir string) (metricsserver.Options, error) {
	opts := metricsserver.Options{BindAddress: addr}
	if !secure {
		return opts, nil
	}
	// controller-runtime falls back to a self-signed certificate when the files are missing, which
	// a scraper configured with the real CA would refuse: a certificate asked for must be there.
	if certDir != "" {
		for _, f := range []string{"tls.crt", "tls.key"} {
			if _, err := os.Stat(filepath.Join(certDir, f)); err != nil {
				return opts, fmt.Errorf("--metrics-cert-dir %s: %w", certDir, err)
			}
		}
	}
	opts.SecureServing = true
	opts.FilterProvider = metricsAuthFilter
	opts.CertDir = certDir
	opts.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	return opts, nil
}

// watchNamespaces are the namespaces --watch-namespaces names (none: every namespace), each a
// namespace's name, once.
func watchNamespaces(flag string) ([]string, error) {
	if strings.TrimSpace(flag) == "" {
		return nil, nil
	}
	var namespaces []string
	for _, ns := range strings.Split(flag, ",") {
		ns = strings.TrimSpace(ns)
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("%q is not a namespace's name: %s", ns, strings.Join(errs, "; "))
		}
		if slices.Contains(namespaces, ns) {
			return nil, fmt.Errorf("namespace %s is named twice", ns)
		}
		namespaces = append(namespaces, ns)
	}
	return namespaces, nil
}

// watchableNamespaces are the watched namespaces that exist, are not being deleted, and whose
// objects the operator may list (its Role there exists); leaving, those being deleted, of which
// only the KVClusters are watched; the others are left out, each with why. None watchable is an
// error: the operator would have nothing to watch.
func watchableNamespaces(c client.Client, namespaces []string) (watchable, leaving []string, left map[string]string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	left = map[string]string{}
	for _, name := range namespaces {
		var ns corev1.Namespace
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &ns); apierrors.IsNotFound(err) {
			left[name] = "it does not exist"
			continue
		} else if err != nil {
			return nil, nil, nil, fmt.Errorf("read namespace %s: %w", name, err)
		} else if ns.DeletionTimestamp != nil {
			leaving = append(leaving, name)
			continue
		}
		// Re-created after a deletion, a namespace no longer has the operator's Role.
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: name, Verb: "list", Group: "apps", Resource: "statefulsets"}}}
		if err := c.Create(ctx, review); err != nil {
			return nil, nil, nil, fmt.Errorf("ask whether the operator may work in namespace %s: %w", name, err)
		}
		if !review.Status.Allowed {
			left[name] = "the operator may not list StatefulSets there: its Role there is missing (re-install or upgrade the chart)"
			continue
		}
		watchable = append(watchable, name)
	}
	if len(watchable) == 0 {
		for _, ns := range leaving {
			left[ns] = "it is being deleted: its KVClusters keep their finalizer until an operator that watches them starts " +
				"(watch another namespace too), or until you remove it (kubectl patch kvc NAME -n " + ns + " --type merge -p '{\"metadata\":{\"finalizers\":null}}')"
		}
		return nil, nil, left, fmt.Errorf("none of the watched namespaces can be watched: %v", left)
	}
	return watchable, leaving, left, nil
}

func must(err error) {
	if err != nil {
		ctrl.Log.Error(err, "setup failed")
		os.Exit(1)
	}
}

// serviceAccountNamespace is where Kubernetes tells a pod its namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// ownPod is the operator's own pod, found by its host name (a pod's host name is its name) in
// namespace (the flag, else the service account's); nil outside a cluster (no service account).
func ownPod(namespace string, reader client.Reader) (*corev1.Pod, error) {
	if namespace == "" {
		data, err := os.ReadFile(serviceAccountNamespace)
		if err != nil { // not in a pod
			return nil, nil
		}
		namespace = strings.TrimSpace(string(data))
	}
	name, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pod corev1.Pod
	if err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pod); err != nil {
		return nil, fmt.Errorf("read the operator's own pod %s/%s: %w", namespace, name, err)
	}
	return &pod, nil
}

// operatorPods are the operator's own pods, which every cluster's NetworkPolicy admits: the
// namespace of its pod and the labels the flag names, which must select its pod — else the
// policies would lock the operator out of every cluster it manages. Outside a cluster, none.
func operatorPods(self *corev1.Pod, podLabels string) (specs.OperatorPods, error) {
	selector, err := labels.ConvertSelectorToLabelsMap(podLabels)
	if err != nil {
		return specs.OperatorPods{}, fmt.Errorf("--operator-pod-labels must be k=v[,k=v...]: %w", err)
	}
	if self == nil {
		return specs.OperatorPods{}, nil
	}
	if !labels.SelectorFromSet(selector).Matches(labels.Set(self.Labels)) {
		return specs.OperatorPods{}, fmt.Errorf("--operator-pod-labels=%s does not select the operator's own pod %s/%s (labels %v)",
			podLabels, self.Namespace, self.Name, self.Labels)
	}
	return specs.OperatorPods{Namespace: self.Namespace, Labels: selector}, nil
}

// jobImage is the image of the Jobs and init containers the operator starts, which run its own
// subcommands: the one given (--backup-image, $OPERATOR_IMAGE), else its own container's. Setting
// the Deployment's image (kustomize, Helm, kubectl set image) then sets both: a second copy of it
// is one a user forgets, and backups would keep running an old operator.
func jobImage(given string, self *corev1.Pod) (string, error) {
	if given != "" {
		return given, nil
	}
	if self == nil {
		return "", fmt.Errorf("outside a cluster, give --backup-image (or OPERATOR_IMAGE): the operator's image, which backup Jobs run")
	}
	containers := self.Spec.Containers
	for _, c := range containers {
		if c.Name == deploy.ManagerContainer {
			return c.Image, nil
		}
	}
	if len(containers) == 1 {
		return containers[0].Image, nil
	}
	return "", fmt.Errorf("the operator's pod %s/%s has no container named %q and more than one container: give --backup-image (the operator's image, which backup Jobs run)",
		self.Namespace, self.Name, deploy.ManagerContainer)
}
