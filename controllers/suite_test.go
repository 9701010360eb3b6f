package controllers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
	"github.com/kvcluster/kvcluster-operator/deploy"
)

// The envtest suite runs a real kube-apiserver and etcd (no kubelet, no controllers): what the
// operator writes, what the API server stores and admits, is real; pods and etcd members are not.
var (
	testEnv    *envtest.Environment
	restConfig *rest.Config
	// operatorConfig acts as the operator's ServiceAccount, with only the generated ClusterRole
	// (deploy/rbac/role.yaml): what the reconciler does, it does with the permissions it ships with.
	operatorConfig *rest.Config
	scheme         = runtime.NewScheme()
	writes         = &writeCounter{}
)

const operatorUser = "system:serviceaccount:kvcluster-system:kvcluster-operator"

// asOperator creates the operator's ClusterRole from deploy/rbac and binds it to the operator's
// ServiceAccount, and returns a configuration that impersonates that ServiceAccount.
func asOperator(admin *rest.Config) (*rest.Config, error) {
	c, err := client.New(admin, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	role, err := deploy.OperatorRole()
	if err != nil {
		return nil, err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "kvcluster-operator", Namespace: "kvcluster-system"}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := c.Create(context.Background(), obj); err != nil {
			return nil, err
		}
	}
	return impersonating(admin, operatorUser), nil
}

func impersonating(admin *rest.Config, user string) *rest.Config {
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return cfg
}

// asNamespacedOperator grants a new ServiceAccount, in installNamespace, what a namespaced
// install grants the operator (deploy.NamespacedRules: the chart's watchNamespaces): a ClusterRole
// for its own kind and namespaces, a Role in each watched namespace for the rest. It returns a
// configuration that impersonates that ServiceAccount.
func asNamespacedOperator(t *testing.T, installNamespace string, watched ...string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	admin, err := client.New(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	role, err := deploy.OperatorRole()
	if err != nil {
		t.Fatal(err)
	}
	clusterRules, namespacedRules := deploy.NamespacedRules(role.Rules)
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "kvcluster-operator", Namespace: installNamespace}
	name := "kvcluster-operator-" + installNamespace
	objs := []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: clusterRules},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: []rbacv1.Subject{sa},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}},
	}
	for _, ns := range watched {
		objs = append(objs,
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvcluster-operator"}, Rules: namespacedRules},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvcluster-operator"}, Subjects: []rbacv1.Subject{sa},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kvcluster-operator"}})
	}
	for _, obj := range objs {
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, obj := range objs[:2] {
			_ = admin.Delete(ctx, obj)
		}
	})
	return impersonating(restConfig, serviceaccount.MakeUsername(installNamespace, "kvcluster-operator"))
}

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		// Almost every test here needs the API server (the pure decisions are tested in plan and
		// specs); the few that do not are skipped with them.
		if os.Getenv(backuptest.RequiredEnv) != "" {
			fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run the tests with 'make test' (it builds kube-apiserver and etcd)")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "skipping the envtest suite: KUBEBUILDER_ASSETS is not set ('make test' builds kube-apiserver and etcd and runs it)")
		os.Exit(0)
	}
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := kvv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "deploy", "crd")},
		ErrorIfCRDPathMissing: true,
	}
	// Clusters that enforce owner-reference permissions refuse blockOwnerDeletion from a client
	// that may not update the owner's finalizers; the reconciler runs with exactly its ClusterRole.
	testEnv.ControlPlane.GetAPIServer().Configure().Append("enable-admission-plugins", "OwnerReferencesPermissionEnforcement")
	// Start leaves the API server and etcd it started running when a later step fails
	// (installing the CRDs, say): stopped, they do not outlive the test binary.
	fail := func(what string, err error) {
		fmt.Fprintln(os.Stderr, what+":", err)
		if err := testEnv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
		os.Exit(1)
	}
	cfg, err := testEnv.Start()
	if err != nil {
		fail("start envtest", err)
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &countingTransport{next: rt, counter: writes} })
	restConfig = cfg
	if operatorConfig, err = asOperator(cfg); err != nil {
		fail("grant the operator's ClusterRole", err)
	}
	code := m.Run()
	if err := testEnv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop envtest:", err)
	}
	os.Exit(code)
}

// writeCounter counts the write requests that reach the API server and remembers the latest ones.
type writeCounter struct {
	n      atomic.Int64
	mu     sync.Mutex
	recent []string
}

func (w *writeCounter) count() int64 { return w.n.Load() }

func (w *writeCounter) add(req *http.Request) {
	w.n.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recent = append(w.recent, req.Method+" "+req.URL.Path)
	if len(w.recent) > 10 {
		w.recent = w.recent[1:]
	}
}

func (w *writeCounter) last(n int64) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.recent[max(0, len(w.recent)-int(n)):]
}

type countingTransport struct {
	next    http.RoundTripper
	counter *writeCounter
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		t.counter.add(req)
	}
	return t.next.RoundTrip(req)
}

// fakeMembers stands in for etcd: tests set what etcd would answer. Membership requests change
// that answer as etcd would, and are recorded in calls.
type fakeMembers struct {
	mu      sync.Mutex
	cluster members.Cluster
	err     error
	calls   []string
	// notReady makes Promote answer ErrLearnerNotReady.
	notReady bool
	// fenceErrs are the errors the next fences answer, one each.
	fenceErrs []error
	nextID    uint64
	// compacted is the revision the last compaction went to; liveBytes what a compaction leaves
	// in use in each member's database, which shows only once it is defragmented (as on a
	// member that commits no write after the compaction).
	compacted, liveBytes int64
	// askedAt are the endpoints the last Cluster query went through; statusOf the members urlOf
	// would have sent a status request to.
	askedAt, statusOf []string
	// notNeeded are the endpoints the last reconcile said would not be asked again for notNeededFor.
	notNeeded    []string
	notNeededFor time.Duration
	// presented is the client configuration the last WithTLS was given.
	presented *tls.Config
}

func (f *fakeMembers) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeMembers) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeMembers) update(change func(c *members.Cluster)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(&f.cluster)
}

func (f *fakeMembers) member(id uint64) *members.Member {
	for i := range f.cluster.Members {
		if f.cluster.Members[i].ID == id {
			return &f.cluster.Members[i]
		}
	}
	return nil
}

func (f *fakeMembers) NotNeededFor(endpoints []string, next time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notNeeded, f.notNeededFor = endpoints, next
}

func (f *fakeMembers) MoveLeader(_ context.Context, leaderEndpoint string, to uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	target := f.member(to)
	if target == nil {
		return fmt.Errorf("no member %x", to)
	}
	for i := range f.cluster.Members {
		f.cluster.Members[i].Leader = false
	}
	target.Leader = true
	f.record("move-leader %s", target.Name)
	return nil
}

func (f *fakeMembers) AddLearner(_ context.Context, _ []string, peerURL string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := 100 + f.nextID
	f.cluster.Members = append(f.cluster.Members, members.Member{ID: id, Learner: true, PeerURLs: []string{peerURL}})
	f.record("add-learner %s", peerURL)
	return id, nil
}

func (f *fakeMembers) Promote(_ context.Context, _ []string, id uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.notReady {
		return members.ErrLearnerNotReady
	}
	m := f.member(id)
	if m == nil {
		return fmt.Errorf("no member %x", id)
	}
	m.Learner = false
	f.record("promote %s", m.Name)
	return nil
}

func (f *fakeMembers) Remove(_ context.Context, _ []string, id uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.member(id)
	if m == nil {
		return fmt.Errorf("no member %x", id)
	}
	f.record("remove %s", m.Name)
	f.cluster.Members = slices.DeleteFunc(f.cluster.Members, func(m members.Member) bool { return m.ID == id })
	return nil
}

func (f *fakeMembers) UpdatePeerURL(_ context.Context, _ []string, id uint64, peerURL string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.member(id)
	if m == nil {
		return fmt.Errorf("no member %x", id)
	}
	f.record("update %s peer URL %s", m.Name, peerURL)
	m.PeerURLs = []string{peerURL}
	return nil
}

func (f *fakeMembers) FenceWrites(ctx context.Context, endpoints []string) (int64, error) {
	return f.fence(endpoints, false)
}

// withCertificate is the fake asked through a client with a certificate (WithTLS): as etcd does,
// the fake answers calls to https endpoints only through it.
type withCertificate struct{ *fakeMembers }

func (c withCertificate) FenceWrites(ctx context.Context, endpoints []string) (int64, error) {
	return c.fence(endpoints, true)
}

func (f *fakeMembers) fence(endpoints []string, withCert bool) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return 0, f.err
	}
	if !withCert && slices.ContainsFunc(endpoints, func(e string) bool { return strings.HasPrefix(e, "https://") }) {
		f.record("fence refused: no client certificate")
		return 0, errors.New("context deadline exceeded")
	}
	if len(f.fenceErrs) > 0 {
		err := f.fenceErrs[0]
		f.fenceErrs = f.fenceErrs[1:]
		f.record("fence refused")
		return 0, err
	}
	f.record("fence")
	if len(f.cluster.Members) > 0 {
		f.cluster.Alarms = append(f.cluster.Alarms, members.Alarm{MemberID: f.cluster.Members[0].ID, Type: "NOSPACE"})
	}
	return 4242, nil
}

func (f *fakeMembers) DisarmAlarm(_ context.Context, _ []string, a members.Alarm) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("disarm %s %x", a.Type, a.MemberID)
	f.cluster.Alarms = slices.DeleteFunc(f.cluster.Alarms, func(b members.Alarm) bool { return b == a })
	return nil
}

// Compact frees, in every member's database, all but liveBytes (what the latest revision holds);
// the sizes do not show it yet.
func (f *fakeMembers) Compact(_ context.Context, _ []string, revision int64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if revision <= f.compacted {
		return false, nil
	}
	f.compacted = revision
	f.record("compact %d", revision)
	return true, nil
}

// Defragment shrinks the database of the member at the endpoint (named in its host) to what it
// uses: what the last compaction left.
func (f *fakeMembers) Defragment(_ context.Context, endpoint string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.cluster.Members {
		if m := &f.cluster.Members[i]; strings.Contains(endpoint, "//"+m.Name+".") {
			f.record("defragment %s", m.Name)
			if f.compacted > 0 {
				m.DBSizeInUse = min(m.DBSizeInUse, f.liveBytes)
			}
			m.DBSize = m.DBSizeInUse
			return nil
		}
	}
	return fmt.Errorf("no member at %s", endpoint)
}

func (f *fakeMembers) set(c members.Cluster, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cluster, f.err = c, err
}

// WithTLS: the fake stands for every cluster, with or without TLS.
func (f *fakeMembers) WithTLS(config *tls.Config) members.Client {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.presented = config
	return withCertificate{f}
}

// presentedCertificate is the certificate the last client configuration presents (DER).
func (f *fakeMembers) presentedCertificate() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.presented == nil || len(f.presented.Certificates) == 0 {
		return nil
	}
	return f.presented.Certificates[0].Certificate[0]
}

func (f *fakeMembers) Cluster(_ context.Context, endpoints []string, urlOf func(members.Member) (string, bool)) (members.Cluster, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.askedAt, f.statusOf = slices.Clone(endpoints), nil
	for _, m := range f.cluster.Members {
		if _, ok := urlOf(m); ok {
			f.statusOf = append(f.statusOf, m.Name)
		}
	}
	c := f.cluster
	c.Members = slices.Clone(c.Members)
	return c, f.err
}

// harness is one reconciler over the real API server, with a fake etcd and a fake clock.
type harness struct {
	t        *testing.T
	client   client.Client
	r        *KVClusterReconciler
	members  *fakeMembers
	clock    *clocktesting.FakePassiveClock
	recorder *events.FakeRecorder
}

// newHarness: the test's own client is an administrator (it plays the kubelet and the other
// controllers); the reconciler's client has only the operator's permissions.
func newHarness(t *testing.T) *harness { return newHarnessAs(t, operatorConfig) }

// newHarnessAs drives a reconciler that acts with the permissions of the user asOperator gives.
func newHarnessAs(t *testing.T, asOperator *rest.Config) *harness {
	t.Helper()
	c, err := client.New(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	op, err := client.NewWithWatch(asOperator, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, client: c, members: &fakeMembers{}, clock: clocktesting.NewFakePassiveClock(time.Now()),
		recorder: events.NewFakeRecorder(100)}
	h.r = &KVClusterReconciler{Client: labelScoped(op), APIReader: op, Recorder: h.recorder, Members: h.members, Clock: h.clock,
		BackupImage: "ghcr.io/kvcluster/kvcluster-operator:test"}
	return h
}

// labelScoped reads like the manager's cache (CacheOptions): of the kinds the operator owns, it
// sees only the objects labelled as the operator's, in the forms the cache keeps (cachedForm,
// cachedIntent).
func labelScoped(c client.WithWatch) client.WithWatch {
	visible := func(obj client.Object) bool {
		if _, isKVC := obj.(*kvv1.KVCluster); isKVC {
			return true
		}
		return obj.GetLabels()[specs.ManagedByLabel] == specs.ManagedByValue
	}
	asCached := func(obj client.Object) {
		switch {
		case slices.ContainsFunc(notComparedKinds(), func(k client.Object) bool { return reflect.TypeOf(k) == reflect.TypeOf(obj) }):
			cachedForm(obj)
		default: // a KVCluster, or an object the operator applies
			cachedIntent(obj)
		}
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := c.Get(ctx, key, obj, opts...); err != nil {
				return err
			}
			if !visible(obj) {
				gvk, _ := apiutil.GVKForObject(obj, scheme)
				return apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind) + "s"}, key.Name)
			}
			asCached(obj)
			return nil
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, indexedAsLabels(opts)...); err != nil {
				return err
			}
			if clusters, isKVC := list.(*kvv1.KVClusterList); isKVC {
				for i := range clusters.Items {
					asCached(&clusters.Items[i])
				}
				return nil
			}
			items, err := meta.ExtractList(list)
			if err != nil {
				return err
			}
			items = slices.DeleteFunc(items, func(o runtime.Object) bool { return !visible(o.(client.Object)) })
			for _, o := range items {
				asCached(o.(client.Object))
			}
			return meta.SetList(list, items)
		},
	})
}

// indexedAsLabels turns a selection through clusterIndex, which only the manager's cache serves,
// into the label it indexes, for the API server.
func indexedAsLabels(opts []client.ListOption) []client.ListOption {
	var lo client.ListOptions
	lo.ApplyOptions(opts)
	name, ok := "", false
	if lo.FieldSelector != nil {
		name, ok = lo.FieldSelector.RequiresExactMatch(clusterIndex)
	}
	if !ok {
		return opts
	}
	selector := labels.SelectorFromSet(labels.Set{specs.ClusterLabel: name})
	if lo.LabelSelector != nil {
		requirements, _ := lo.LabelSelector.Requirements()
		selector = selector.Add(requirements...)
	}
	lo.FieldSelector, lo.LabelSelector = nil, selector
	return []client.ListOption{&lo}
}

// restartOperator replaces the reconciler by a new one that remembers nothing.
func (h *harness) restartOperator() {
	h.r = &KVClusterReconciler{Client: h.r.Client, APIReader: h.r.APIReader, Recorder: h.r.Recorder, Members: h.r.Members,
		Clock: h.r.Clock, EtcdRepository: h.r.EtcdRepository, BackupImage: h.r.BackupImage, Operator: h.r.Operator, Workers: h.r.Workers}
}

func (h *harness) reconcile(kvc *kvv1.KVCluster) ctrl.Result {
	h.t.Helper()
	res, err := h.r.Reconcile(context.Background(), requestFor(kvc))
	if err != nil {
		h.t.Fatalf("reconcile %s: %v", kvc.Name, err)
	}
	return res
}

func requestFor(kvc *kvv1.KVCluster) ctrl.Request {
	return ctrl.Request{NamespacedName: client.ObjectKeyFromObject(kvc)}
}

// collectGarbage plays the garbage collector, which envtest lacks: it deletes the objects of a
// namespace whose controlling owner (a KVCluster, a StatefulSet or a Job) is gone. Claims have none: they stay.
func (h *harness) collectGarbage(ns string) {
	h.t.Helper()
	for h.collectGarbageOnce(ns) { // what a deleted object owned (a StatefulSet's pods) goes next
	}
}

// collectGarbageOnce deletes what has lost its controlling owner and says whether it deleted any.
func (h *harness) collectGarbageOnce(ns string) (deleted bool) {
	h.t.Helper()
	ctx := context.Background()
	lists := []client.ObjectList{&corev1.ServiceList{}, &corev1.ConfigMapList{}, &appsv1.StatefulSetList{},
		&policyv1.PodDisruptionBudgetList{}, &batchv1.JobList{}, &corev1.PodList{}}
	for _, list := range lists {
		if err := h.client.List(ctx, list, client.InNamespace(ns)); err != nil {
			h.t.Fatal(err)
		}
		objs, err := meta.ExtractList(list)
		if err != nil {
			h.t.Fatal(err)
		}
		for _, o := range objs {
			obj := o.(client.Object)
			ref := metav1.GetControllerOf(obj)
			if ref == nil {
				continue
			}
			var owner client.Object = &kvv1.KVCluster{}
			switch ref.Kind {
			case "Job":
				owner = &batchv1.Job{}
			case "StatefulSet":
				owner = &appsv1.StatefulSet{}
			}
			err := h.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, owner)
			if client.IgnoreNotFound(err) != nil {
				h.t.Fatal(err)
			}
			if err == nil && owner.GetUID() == ref.UID {
				continue
			}
			if obj.GetDeletionTimestamp() != nil {
				continue
			}
			if err := h.client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				h.t.Fatal(err)
			}
			deleted = true
		}
	}
	return deleted
}
