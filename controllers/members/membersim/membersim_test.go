package membersim

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// simulated serves a Sim over the pods of c and returns the operator's etcd client, routed to it.
func simulated(t *testing.T, c client.Client) (*Sim, members.EtcdClient) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sim := &Sim{Pods: c}
	go func() { _ = sim.Serve(l) }()
	t.Cleanup(func() { _ = l.Close() })
	return sim, members.EtcdClient{Timeout: time.Second, DialOptions: []grpc.DialOption{DialOption(l.Addr().String())}}
}

func testCluster(name string, partitions int32) *kvv1.KVCluster {
	return &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: kvv1.KVClusterSpec{Partitions: partitions}}
}

func memberPod(kvc *kvv1.KVCluster, ordinal int, version string, ready bool) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: specs.MemberName(kvc, ordinal)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "registry.example:5000/etcd:v" + version}}},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func membershipConfigMap(kvc *kvv1.KVCluster) *corev1.ConfigMap {
	ac := specs.MembershipConfigMap(kvc, specs.NewClusterMembership(kvc), "")
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: *ac.Name, UID: types.UID(kvc.Name + "-uid")}, Data: ac.Data}
}

func urlOf(kvc *kvv1.KVCluster) func(members.Member) (string, bool) {
	return func(m members.Member) (string, bool) {
		ord, ok := specs.OrdinalOfMember(kvc, m.Name)
		return specs.MemberClientURL(kvc, "http", ord), ok
	}
}

func setReady(t *testing.T, c client.Client, kvc *kvv1.KVCluster, ordinal int, version string, ready bool) {
	t.Helper()
	pod := memberPod(kvc, ordinal, version, ready)
	if err := c.Update(context.Background(), pod); err != nil {
		if err := c.Create(context.Background(), pod); err != nil {
			t.Fatal(err)
		}
	}
}

// A new cluster answers as etcd does while its members start: nothing until a pod runs, no quorum
// with one of three, then the member list with the started members named, healthy, on their pods'
// versions, one leader.
func TestANewClusterAnswersAsItsPodsStart(t *testing.T) {
	ctx := context.Background()
	kvc := testCluster("kv", 3)
	c := fake.NewClientBuilder().WithObjects(membershipConfigMap(kvc)).Build()
	_, etcd := simulated(t, c)
	endpoints := specs.MemberClientURLs(kvc, "http")

	if _, err := etcd.Cluster(ctx, endpoints, urlOf(kvc)); err == nil {
		t.Fatalf("no pod runs: Cluster() = %v, want an error", err)
	}
	setReady(t, c, kvc, 0, "3.7.3", true)
	if _, err := etcd.Cluster(ctx, endpoints, urlOf(kvc)); !errors.Is(err, members.ErrNoQuorum) {
		t.Fatalf("one of three runs: Cluster() = %v, want ErrNoQuorum", err)
	}
	setReady(t, c, kvc, 1, "3.7.3", true)
	setReady(t, c, kvc, 2, "3.7.3", false)
	got, err := etcd.Cluster(ctx, endpoints, urlOf(kvc))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Members) != 3 || !got.HasLeader {
		t.Fatalf("two of three run: %+v, want 3 members and a leader", got)
	}
	// Sorted by name: the unstarted member (no name) first.
	if m := got.Members[0]; m.Started() || m.Healthy {
		t.Errorf("member 2 never ran: %+v, want no name, not healthy", m)
	}
	leader, _ := got.Leader()
	for i, m := range got.Members[1:] {
		if m.Name != specs.MemberName(kvc, i) || !m.Healthy || m.Version != "3.7.3" || m.Learner {
			t.Errorf("member %d: %+v, want started, healthy, 3.7.3, voting", i, m)
		}
	}
	if leader.Name != "kv-0" {
		t.Errorf("leader %q, want kv-0 (the lowest running ordinal)", leader.Name)
	}
}

// The steps of a roll and a scale-up behave as etcd's: leadership moves only from the leader, a
// learner is promoted only once its pod runs, a member restarted on a new image reports it.
func TestMembershipChangesFollowTheRequests(t *testing.T) {
	ctx := context.Background()
	kvc := testCluster("kv", 3)
	c := fake.NewClientBuilder().WithObjects(membershipConfigMap(kvc)).Build()
	_, etcd := simulated(t, c)
	endpoints := specs.MemberClientURLs(kvc, "http")
	for i := range 3 {
		setReady(t, c, kvc, i, "3.6.16", true)
	}
	view, err := etcd.Cluster(ctx, endpoints, urlOf(kvc))
	if err != nil {
		t.Fatal(err)
	}
	leader, _ := view.Leader()
	to := view.Members[2]
	if err := etcd.MoveLeader(ctx, specs.MemberClientURL(kvc, "http", 1), to.ID); err == nil {
		t.Error("MoveLeader through a follower succeeded")
	}
	if err := etcd.MoveLeader(ctx, specs.MemberClientURL(kvc, "http", 0), to.ID); err != nil {
		t.Fatalf("MoveLeader from %s: %v", leader.Name, err)
	}
	setReady(t, c, kvc, 0, "3.7.3", true) // restarted on the new image
	view, _ = etcd.Cluster(ctx, endpoints, urlOf(kvc))
	if l, _ := view.Leader(); l.Name != "kv-2" || view.Members[0].Version != "3.7.3" || view.Members[1].Version != "3.6.16" {
		t.Errorf("after the move and a restart: %+v", view.Members)
	}

	id, err := etcd.AddLearner(ctx, endpoints, specs.MemberPeerURL(kvc, 3))
	if err != nil {
		t.Fatal(err)
	}
	if err := etcd.Promote(ctx, endpoints, id); !errors.Is(err, members.ErrLearnerNotReady) {
		t.Errorf("Promote before the learner's pod runs = %v, want ErrLearnerNotReady", err)
	}
	setReady(t, c, kvc, 3, "3.7.3", true)
	// The running learner answers its status but refuses the member list: the list is read through
	// a voter, whichever answers first (asked often enough that the learner is first at times).
	withLearner := append(slices.Clone(endpoints), specs.MemberClientURL(kvc, "http", 3))
	for range 20 {
		view, err := etcd.Cluster(ctx, withLearner, urlOf(kvc))
		if err != nil {
			t.Fatalf("with a running learner: %v", err)
		}
		if len(view.Members) != 4 || view.Voting() != 3 || !view.Members[3].Healthy {
			t.Fatalf("with a running learner: %+v", view.Members)
		}
	}
	if err := etcd.Promote(ctx, endpoints, id); err != nil {
		t.Errorf("Promote once it runs: %v", err)
	}
	if err := etcd.Remove(ctx, endpoints[1:], view.Members[0].ID); err != nil {
		t.Fatal(err)
	}
	view, _ = etcd.Cluster(ctx, append(endpoints, specs.MemberClientURL(kvc, "http", 3)), urlOf(kvc))
	if len(view.Members) != 3 || view.Voting() != 3 || view.Members[0].Name != "kv-1" {
		t.Errorf("after adding kv-3 and removing kv-0: %+v", view.Members)
	}
	rev, err := etcd.FenceWrites(ctx, endpoints[1:])
	if err != nil || rev < 1 {
		t.Fatalf("FenceWrites = %d, %v", rev, err)
	}
	if view, _ := etcd.Cluster(ctx, endpoints[1:], urlOf(kvc)); len(view.Alarms) != 1 || view.Alarms[0].Type != "NOSPACE" {
		t.Errorf("alarms after fencing: %+v", view.Alarms)
	}
}

// A frozen cluster holds its client until the client's own deadline; the others answer meanwhile.
func TestAFrozenClusterAnswersNothing(t *testing.T) {
	ctx := context.Background()
	frozen, live := testCluster("frozen", 1), testCluster("live", 1)
	c := fake.NewClientBuilder().WithObjects(membershipConfigMap(frozen), membershipConfigMap(live)).Build()
	sim, etcd := simulated(t, c)
	setReady(t, c, frozen, 0, "3.7.3", true)
	setReady(t, c, live, 0, "3.7.3", true)
	sim.Freeze(types.NamespacedName{Namespace: "ns", Name: "frozen"}, true)

	start := time.Now()
	if _, err := etcd.Cluster(ctx, specs.MemberClientURLs(frozen, "http"), urlOf(frozen)); err == nil {
		t.Fatal("a frozen cluster answered")
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("a frozen cluster failed after %v, want the client's 1s timeout", took)
	}
	if held := sim.Held(types.NamespacedName{Namespace: "ns", Name: "frozen"}); held == 0 {
		t.Error("Held() = 0 after a request to the frozen cluster")
	}
	if _, err := etcd.Cluster(ctx, specs.MemberClientURLs(live, "http"), urlOf(live)); err != nil {
		t.Errorf("the live cluster: %v", err)
	}
	sim.Freeze(types.NamespacedName{Namespace: "ns", Name: "frozen"}, false)
	if _, err := etcd.Cluster(ctx, specs.MemberClientURLs(frozen, "http"), urlOf(frozen)); err != nil {
		t.Errorf("thawed: %v", err)
	}
}

// Pooled clients dial each member once across requests, a client unused for the pool's idle time
// is closed, and a request left unanswered closes its client: a cluster that answers again is
// asked on new connections, not on the ones that went silent.
func TestPooledClientsAreReusedUntilIdleOrUnanswered(t *testing.T) {
	ctx := context.Background()
	kvc := testCluster("kv", 3)
	c := fake.NewClientBuilder().WithObjects(membershipConfigMap(kvc)).Build()
	sim, unpooled := simulated(t, c)
	for i := range 3 {
		setReady(t, c, kvc, i, "3.7.3", true)
	}
	endpoints := specs.MemberClientURLs(kvc, "http")
	ask := func(etcd members.EtcdClient) int64 {
		t.Helper()
		before, _ := sim.Stats()
		if _, err := etcd.Cluster(ctx, endpoints, urlOf(kvc)); err != nil {
			t.Fatal(err)
		}
		after, _ := sim.Stats()
		return after - before
	}
	if first, second := ask(unpooled), ask(unpooled); first == 0 || second != first {
		t.Fatalf("without a pool: %d and %d connections, want the same number each time", first, second)
	}

	pool := members.NewPool(time.Hour, 10)
	pooled := unpooled
	pooled.Pool = pool
	if first := ask(pooled); first == 0 {
		t.Fatal("the first request through the pool opened no connection")
	}
	for range 3 {
		if again := ask(pooled); again != 0 {
			t.Fatalf("a later request opened %d connections, want 0", again)
		}
	}
	if n := pool.Len(); n != 3 {
		t.Errorf("the pool holds %d clients, want 3 (one per member)", n)
	}

	sim.Freeze(types.NamespacedName{Namespace: "ns", Name: "kv"}, true)
	if _, err := pooled.Cluster(ctx, endpoints, urlOf(kvc)); err == nil {
		t.Fatal("a frozen cluster answered")
	}
	sim.Freeze(types.NamespacedName{Namespace: "ns", Name: "kv"}, false)
	if redialled := ask(pooled); redialled == 0 {
		t.Error("after an unanswered request the pooled connections were used again, want new ones")
	}

	pooled.Pool = members.NewPool(50*time.Millisecond, 10)
	ask(pooled)
	deadline := time.Now().Add(5 * time.Second)
	for pooled.Pool.Len() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := pooled.Pool.Len(); n != 0 {
		t.Errorf("%d clients still open after the idle time", n)
	}
}

// blockingLive is an API server that does not answer for one cluster's pods until released.
type blockingLive struct {
	client.Reader
	cluster  string
	entered  chan struct{} // receives as a read is held (at least the first)
	released chan struct{}
}

func (b blockingLive) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, isPod := obj.(*corev1.Pod); isPod && strings.HasPrefix(key.Name, b.cluster+"-") {
		select { // the test waits for the first only
		case b.entered <- struct{}{}:
		default:
		}
		select {
		case <-b.released:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return b.Reader.Get(ctx, key, obj, opts...)
}

// A request to one cluster never waits for another's: while a request to a cluster whose members
// are still starting waits for the API server, another cluster answers at once, as two etcd
// clusters would.
func TestAClusterAnswersWhileAnotherWaitsForTheAPIServer(t *testing.T) {
	ctx := context.Background()
	starting, running := testCluster("starting", 3), testCluster("running", 3)
	c := fake.NewClientBuilder().WithObjects(membershipConfigMap(starting), membershipConfigMap(running)).Build()
	live := blockingLive{Reader: c, cluster: "starting", entered: make(chan struct{}, 8), released: make(chan struct{})}
	sim, etcd := simulated(t, c)
	sim.Live = live
	defer close(live.released)
	setReady(t, c, starting, 0, "3.7.3", true) // members 1 and 2 not Ready: read again from the API server
	for i := range 3 {
		setReady(t, c, running, i, "3.7.3", true)
	}

	// Member 0 is asked alone: it is Ready, so the reads that wait are those of its cluster's
	// other members, made while the request holds its cluster; and for longer than the running
	// cluster is given to answer.
	patient := etcd
	patient.Timeout = time.Minute
	go func() { _, _ = patient.Cluster(ctx, specs.MemberClientURLs(starting, "http")[:1], urlOf(starting)) }()
	select {
	case <-live.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the request to the starting cluster never read its members from the API server")
	}
	got, err := etcd.Cluster(ctx, specs.MemberClientURLs(running, "http"), urlOf(running))
	if err != nil {
		t.Fatalf("the running cluster, while the starting one waits for the API server: %v", err)
	}
	if sick := slices.IndexFunc(got.Members, func(m members.Member) bool { return !m.Healthy }); sick >= 0 || !got.HasLeader {
		t.Errorf("the running cluster, while the starting one waits for the API server: %+v, want 3 healthy members and a leader", got)
	}
}
