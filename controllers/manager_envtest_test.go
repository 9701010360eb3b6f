package controllers

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/members/memberstest"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// hangingMembers stands in for etcd clusters whose members never answer (a frozen process, a
// black-holed network): asking a cluster whose endpoints contain hang blocks until released.
type hangingMembers struct {
	fakeMembers
	hang    string
	asked   chan struct{}
	release chan struct{}
}

func (m *hangingMembers) WithTLS(*tls.Config) members.Client { return m }

func (m *hangingMembers) Cluster(ctx context.Context, endpoints []string, _ func(members.Member) (string, bool)) (members.Cluster, error) {
	if slices.ContainsFunc(endpoints, func(e string) bool { return strings.Contains(e, m.hang) }) {
		select {
		case m.asked <- struct{}{}:
		default:
		}
		select {
		case <-m.release:
		case <-ctx.Done():
		}
	}
	return members.Cluster{}, errNoQuorum
}

// frozenMembers stands in for clusters whose members take every request and answer none: a
// request through the client URL of one in frozen waits until the test releases one, and asked
// names its cluster.
type frozenMembers struct {
	fakeMembers
	frozen  map[string]string // client URL → cluster name
	asked   chan string
	release chan struct{}
}

func (m *frozenMembers) WithTLS(*tls.Config) members.Client { return m }

func (m *frozenMembers) Cluster(ctx context.Context, endpoints []string, _ func(members.Member) (string, bool)) (members.Cluster, error) {
	for _, e := range endpoints {
		if name, ok := m.frozen[e]; ok {
			select {
			case m.asked <- name:
			case <-ctx.Done():
				return members.Cluster{}, ctx.Err()
			}
			select {
			case <-m.release:
			case <-ctx.Done():
			}
		}
	}
	return members.Cluster{}, errNoQuorum
}

// startManager runs the reconciler in a real manager, with the cache configured as the operator
// binary configures it, as the operator's ServiceAccount.
func startManager(t *testing.T, etcd members.Client) { startManagerWith(t, etcd, 8) }

func startManagerWith(t *testing.T, etcd members.Client, workers int) {
	t.Helper()
	startManagerAs(t, operatorConfig, nil, nil, etcd, workers)
}

// startManagerAs runs the reconciler in a real manager as the user cfg impersonates, watching the
// namespaces given (nil: all), and the KVClusters of those leaving, as the operator binary does.
func startManagerAs(t *testing.T, cfg *rest.Config, watched, leaving []string, etcd members.Client, workers int) {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Client:                 client.Options{FieldOwner: specs.FieldManager},
		Cache:                  CacheOptionsLeaving(watched, leaving),
		// Each test starts its own manager with the same controller name.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &KVClusterReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(specs.FieldManager),
		Members: etcd, Clock: clock.RealClock{}, BackupImage: "ghcr.io/kvcluster/kvcluster-operator:test", Workers: workers, Leaving: leaving}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// TestOneHangingClusterDoesNotHoldUpTheOthers: clusters are reconciled side by side, so a cluster
// whose members never answer delays no other cluster.
func TestOneHangingClusterDoesNotHoldUpTheOthers(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("workers")
	etcd := &hangingMembers{hang: "frozen-", asked: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(etcd.release)
	startManager(t, etcd)

	frozen := newKVCluster(ns, "frozen", 1)
	h.create(frozen)
	// Once it has a member pod, the operator asks etcd about the cluster.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := h.client.Get(context.Background(), client.ObjectKeyFromObject(frozen), &appsv1.StatefulSet{}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no StatefulSet for the frozen cluster: %v", err)
		}
	}
	h.setMembersReady(frozen, 0)
	select {
	case <-etcd.asked:
	case <-time.After(30 * time.Second):
		t.Fatal("the frozen cluster was never reconciled")
	}
	other := newKVCluster(ns, "other", 1)
	h.create(other)
	for deadline := time.Now().Add(30 * time.Second); h.fresh(other).Status.Phase != kvv1.PhaseCreating; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("while one cluster's reconcile hangs on its members, another cluster got no status")
		}
	}
}

// TestLookingAgainWaitsBehindNews: a cluster whose members do not answer is looked at again every
// few seconds, and each look holds a worker for the whole etcd timeout. With more such clusters
// than workers their looks would fill the queue ahead of everything else; they wait behind every
// cluster a watch event woke instead. With one worker: while it waits on one frozen cluster, the
// other's next look falls due and a new cluster is created; the new cluster goes first.
func TestLookingAgainWaitsBehindNews(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("priority")
	frozen := []*kvv1.KVCluster{newKVCluster(ns, "frozen-a", 1), newKVCluster(ns, "frozen-b", 1)}
	etcd := &frozenMembers{frozen: map[string]string{}, asked: make(chan string), release: make(chan struct{})}
	for _, kvc := range frozen {
		etcd.frozen[specs.MemberClientURL(kvc, "http", 0)] = kvc.Name
	}
	startManagerWith(t, etcd, 1)
	nextAsked := func() string {
		t.Helper()
		select {
		case name := <-etcd.asked:
			return name
		case <-time.After(30 * time.Second):
			t.Fatal("the frozen clusters were not asked about")
			return ""
		}
	}

	// Both frozen clusters are asked about once, and get no answer at once.
	for _, kvc := range frozen {
		h.create(kvc)
		eventually(t, "no StatefulSet for "+kvc.Name, func() bool {
			return h.client.Get(context.Background(), client.ObjectKeyFromObject(kvc), &appsv1.StatefulSet{}) == nil
		})
	}
	for _, kvc := range frozen {
		h.setMembersReady(kvc, 1)
	}
	asked := map[string]bool{}
	for len(asked) < 2 {
		asked[nextAsked()] = true
		etcd.release <- struct{}{}
	}
	// The next look is held: the one worker waits on it while the other frozen cluster's next look
	// falls due (5 s after its last) and a new cluster is created.
	held := nextAsked()
	time.Sleep(6 * time.Second)
	news := newKVCluster(ns, "news", 1)
	h.create(news)
	time.Sleep(2 * time.Second) // its creation reaches the queue
	etcd.release <- struct{}{}
	for deadline := time.Now().Add(20 * time.Second); h.fresh(news).Status.Phase == ""; {
		select {
		case name := <-etcd.asked:
			if h.fresh(news).Status.Phase == "" {
				t.Fatalf("after %s, %s was looked at again before the new cluster got its first status", held, name)
			}
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the new cluster got no status")
		}
	}
}

// eventually polls cond every 100ms for up to 30s and fails with what when it never holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
	}
}

// TestTheManagerWatchesWhatTheClusterOwns runs the reconciler as the binary does: nothing calls
// Reconcile but the manager's watches, and its cache holds only the operator's labelled objects.
// A Ready cluster is polled once a minute, so what is put back within seconds is put back by a
// watch: the For, Owns and guard watches, and the API-server lookup of what the cache cannot see.
func TestTheManagerWatchesWhatTheClusterOwns(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	ns := h.namespace("manager")
	kvc := withBackups(newKVCluster(ns, "kv", 3), "") // a final backup is wanted: the cluster keeps a guard
	h.members.set(memberstest.Healthy(kvc, 3, "3.7.3"), nil)
	startManager(t, h.members)

	h.create(kvc)
	eventually(t, "the KVCluster's creation started no reconcile", func() bool {
		return h.client.Get(ctx, client.ObjectKeyFromObject(kvc), &appsv1.StatefulSet{}) == nil
	})
	h.setMembersReady(kvc, 3)
	eventually(t, "the StatefulSet's readiness was not noticed", func() bool { return h.fresh(kvc).Status.Phase == kvv1.PhaseReady })

	for _, obj := range []client.Object{
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kv-client"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: specs.GuardName(kvc)}},
	} {
		var before types.UID
		if err := h.client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		before = obj.GetUID()
		if err := h.client.Delete(ctx, obj); err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("%T %s was deleted and not put back", obj, obj.GetName()), func() bool {
			return h.client.Get(ctx, client.ObjectKeyFromObject(obj), obj) == nil && obj.GetUID() != before
		})
	}

	// Someone else's unlabelled Service is not in the cache; it must not look absent.
	theirs := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other-client"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	if err := h.client.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	other := newKVCluster(ns, "other", 1)
	h.create(other)
	eventually(t, "someone else's Service under the cluster's name was not reported", func() bool {
		c := meta.FindStatusCondition(h.fresh(other).Status.Conditions, kvv1.ConditionStalled)
		return c != nil && c.Reason == plan.ReasonObjectConflict
	})
	if err := h.client.Get(ctx, client.ObjectKeyFromObject(theirs), theirs); err != nil || len(theirs.OwnerReferences) != 0 || theirs.Labels[specs.ManagedByLabel] != "" {
		t.Errorf("someone else's Service was written: %v %+v", err, theirs.ObjectMeta)
	}
}

// TestMemberReadinessIsReadFromThePods: the operator reads member readiness from the pods, so a
// cluster turns Ready while the StatefulSet's status still counts no ready pod (its controller
// writes it seconds late when it syncs many StatefulSets); and it watches them, so a Ready
// cluster, looked at once a minute, reports a member that stops being Ready at once.
func TestMemberReadinessIsReadFromThePods(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("pods")
	kvc := newKVCluster(ns, "kv", 3)
	h.members.set(memberstest.Healthy(kvc, 3, "3.7.3"), nil)
	startManager(t, h.members)

	h.create(kvc)
	eventually(t, "the KVCluster's creation started no reconcile", func() bool {
		return h.client.Get(context.Background(), client.ObjectKeyFromObject(kvc), &appsv1.StatefulSet{}) == nil
	})
	h.setMembersReady(kvc, 0)    // the StatefulSet controller made the pods and wrote its status once
	h.setMemberPodsReady(kvc, 3) // then the pods turned Ready; the StatefulSet's status still says 0
	eventually(t, "the cluster did not turn Ready with its pods", func() bool {
		st := h.fresh(kvc).Status
		return st.Phase == kvv1.PhaseReady && st.ReadyPartitions == 3
	})

	time.Sleep(time.Second) // the reconciles after its own status write are over
	h.setMemberPodsReady(kvc, 2)
	eventually(t, "a member pod that stopped being Ready was not noticed", func() bool {
		st := h.fresh(kvc).Status
		return st.ReadyPartitions == 2 && !meta.IsStatusConditionTrue(st.Conditions, kvv1.ConditionReady)
	})
}
