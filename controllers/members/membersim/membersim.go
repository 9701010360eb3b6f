// Package membersim stands in for the etcd members of KVClusters whose pods cannot run etcd: the
// simulated nodes of the fleet benchmark (`make bench-scale`). It serves etcd's own gRPC API
// (membership, status, alarms, leadership, compaction, defragmentation) and answers from the
// member pods' state in the API server, so the operator runs its real etcd client, with its real
// connections and timeouts, against it.
//
// Every connection an operator built with the kvcsim tag opens to a member goes to one Sim,
// starting with a line naming the address it dialled ("kv-0.kv-peer.ns.svc:2379"): that names the
// cluster and the member. A member takes a connection as its pod's etcd flags say (plaintext, TLS
// with the server certificate its pod mounts, or either) and answers while its pod is Ready; a
// cluster's membership starts as its membership ConfigMap says and then changes only through the
// requests the operator sends, as etcd's does. A frozen cluster accepts connections and never
// answers, as a SIGSTOPped etcd.
package membersim

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// The sizes a member reports: a small database with no free pages, etcd's default quota.
const (
	dbSize  = 4 << 20
	dbQuota = 2 << 30
)

// Sim is the simulated etcd of every KVCluster.
type Sim struct {
	// Pods reads the member pods, the clusters' membership ConfigMaps and the members' certificate
	// Secrets (a cache in the benchmark); Live, if set, the API server itself.
	Pods, Live client.Reader

	// mu guards the maps below. Each cluster has a lock of its own, as each etcd cluster is its
	// own: a request never waits for another cluster's (whose answer may first read the API
	// server), which a fleet's real members never do either.
	mu       sync.Mutex
	clusters map[types.UID]*cluster // by the membership ConfigMap's UID: a new cluster under an old name starts afresh
	frozen   map[types.NamespacedName]bool
	// held counts the connections and requests a frozen cluster left unanswered.
	held map[types.NamespacedName]int
	// served are the members' server certificates, by their Secret.
	served map[types.NamespacedName]servedCertificate

	conns, requests atomic.Int64
}

type cluster struct {
	mu        sync.Mutex // held for the whole of a request to this cluster
	id        uint64
	members   []*member
	leader    uint64
	term      uint64
	compacted int64
	alarms    []*pb.AlarmMember
}

type member struct {
	id       uint64
	ordinal  int
	peerURLs []string
	learner  bool
	// started: its pod has been Ready since it was added (etcd knows a member's name and client
	// URLs only once it has run).
	started bool
}

// Stats are what the simulated members served: connections accepted and requests answered.
func (s *Sim) Stats() (conns, requests int64) { return s.conns.Load(), s.requests.Load() }

// Freeze makes a cluster's members stop answering (true) or answer again (false); connections
// opened meanwhile stay open, unanswered.
func (s *Sim) Freeze(cluster types.NamespacedName, frozen bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.frozen == nil {
		s.frozen = map[types.NamespacedName]bool{}
	}
	if frozen {
		s.frozen[cluster] = true
	} else {
		delete(s.frozen, cluster)
	}
}

// Held is how many connections and requests a frozen cluster has left unanswered.
func (s *Sim) Held(cluster types.NamespacedName) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[cluster]
}

// hold reports whether t's cluster is frozen, counting what it leaves unanswered.
func (s *Sim) hold(t target) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.frozen[t.cluster] {
		return false
	}
	if s.held == nil {
		s.held = map[types.NamespacedName]int{}
	}
	s.held[t.cluster]++
	return true
}

// target is the member a connection was opened to.
type target struct {
	cluster types.NamespacedName
	member  string
	addr    string
}

func (t target) Network() string { return "membersim" }
func (t target) String() string  { return t.addr }

// parseTarget reads "<member>.<cluster>-peer.<namespace>.svc:<port>", the member client URL's host.
func parseTarget(addr string) (target, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return target{}, err
	}
	labels := strings.Split(host, ".")
	name, ok := "", len(labels) == 4 && labels[3] == "svc"
	if ok {
		name, ok = strings.CutSuffix(labels[1], "-peer")
	}
	if !ok {
		return target{}, fmt.Errorf("%q is not a member's address", addr)
	}
	return target{cluster: types.NamespacedName{Namespace: labels[2], Name: name}, member: labels[0], addr: addr}, nil
}

// DialOption makes an etcd client connect to the Sim listening at addr (host:port) whichever
// member it dials, naming that member in the connection's first line.
func DialOption(addr string) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, member string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		if _, err := fmt.Fprintf(conn, "%s\n", member); err != nil {
			_ = conn.Close()
			return nil, err
		}
		return conn, nil
	})
}

// Serve answers on l until it is closed. Connections to a member whose pod is not Ready are
// closed at once (nothing listens there); those to a frozen cluster are held, unanswered.
func (s *Sim) Serve(l net.Listener) error {
	srv := grpc.NewServer(grpc.Creds(insecure.NewCredentials()))
	pb.RegisterClusterServer(srv, clusterAPI{s: s})
	pb.RegisterMaintenanceServer(srv, maintenanceAPI{s: s})
	pb.RegisterKVServer(srv, kvAPI{s: s})
	accepted := &chanListener{Listener: l, conns: make(chan net.Conn), done: make(chan struct{})}
	go func() {
		defer close(accepted.done)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go s.admit(conn, accepted)
		}
	}()
	err := srv.Serve(accepted)
	srv.Stop()
	return err
}

func (s *Sim) admit(conn net.Conn, to *chanListener) {
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	t, perr := parseTarget(strings.TrimSpace(line))
	if err != nil || perr != nil {
		_ = conn.Close()
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	s.conns.Add(1)
	if s.hold(t) {
		// A stopped process's socket: the kernel accepted the connection, nobody reads it.
		_, _ = r.WriteTo(discard{})
		_ = conn.Close()
		return
	}
	pod, err := s.runningPod(context.Background(), t)
	if err != nil {
		_ = conn.Close()
		return
	}
	secured, err := s.secured(context.Background(), &targetConn{Conn: conn, r: r, t: t}, pod)
	if err != nil { // a client of a scheme the member does not take, or one without a certificate it trusts
		_ = conn.Close()
		return
	}
	select {
	case to.conns <- secured:
	case <-to.done:
		_ = conn.Close()
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// chanListener hands the gRPC server the connections admit let through.
type chanListener struct {
	net.Listener
	conns chan net.Conn
	done  chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// targetConn is a connection whose remote address is the member dialled: handlers find it
// through grpc/peer.
type targetConn struct {
	net.Conn
	r *bufio.Reader
	t target
}

func (c *targetConn) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *targetConn) RemoteAddr() net.Addr       { return c.t }

// runningPod is the member's pod if its etcd runs: the pod is Ready (being deleted or not: etcd
// serves until it exits, which on a simulated node is when the pod is gone). A pod the cache does
// not show running is read again from the API server (Live): the operator may have seen it
// become Ready first, and real etcd would already answer.
func (s *Sim) runningPod(ctx context.Context, t target) (*corev1.Pod, error) {
	key := client.ObjectKey{Namespace: t.cluster.Namespace, Name: t.member}
	var pod corev1.Pod
	err := s.Pods.Get(ctx, key, &pod)
	if (err != nil || !isReady(&pod)) && s.Live != nil {
		err = s.Live.Get(ctx, key, &pod)
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "connection refused: pod %s: %v", t.member, err)
	}
	if !isReady(&pod) {
		return nil, status.Errorf(codes.Unavailable, "connection refused: pod %s is not running", t.member)
	}
	return &pod, nil
}

func isReady(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// call is one request: the member it reached, its cluster (locked until done) and its pod.
type call struct {
	s   *Sim
	kvc *kvv1.KVCluster
	c   *cluster
	pod *corev1.Pod
	// self is the member the request reached.
	self *member
}

// begin finds who a request reached and locks its cluster for it; the caller runs done.
func (s *Sim) begin(ctx context.Context) (*call, error) {
	s.requests.Add(1)
	p, ok := peer.FromContext(ctx)
	t, isTarget := p.Addr.(target)
	if !ok || !isTarget {
		return nil, status.Error(codes.Internal, "membersim: unknown connection")
	}
	if s.hold(t) {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	pod, err := s.runningPod(ctx, t)
	if err != nil {
		return nil, err
	}
	kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Namespace: t.cluster.Namespace, Name: t.cluster.Name}}
	var cm corev1.ConfigMap
	if err := s.Pods.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.MembershipConfigMapName(kvc)}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, status.Errorf(codes.Unavailable, "membersim: cluster %s has no membership ConfigMap", t.cluster)
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	ord, ok := specs.OrdinalOfMember(kvc, t.member)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "membersim: %s is not a member of %s", t.member, t.cluster)
	}
	s.mu.Lock()
	if s.clusters == nil {
		s.clusters = map[types.UID]*cluster{}
	}
	c := s.clusters[cm.UID]
	if c == nil {
		m, ok := specs.ParseMembership(kvc, cm.Data)
		if !ok {
			s.mu.Unlock()
			return nil, status.Errorf(codes.Unavailable, "membersim: cannot read the membership of %s", t.cluster)
		}
		c = &cluster{id: rand.Uint64() | 1, term: 1}
		for _, o := range m.Ordinals {
			url, ok := m.PeerURLs[o]
			if !ok {
				url = specs.MemberPeerURL(kvc, o)
			}
			c.members = append(c.members, &member{id: rand.Uint64() | 1, ordinal: o, peerURLs: []string{url}})
		}
		s.clusters[cm.UID] = c
	}
	s.mu.Unlock()
	c.mu.Lock()
	k := &call{s: s, kvc: kvc, c: c, pod: pod}
	k.refresh(ctx)
	for _, m := range c.members {
		if m.ordinal == ord && m.started {
			k.self = m
		}
	}
	if k.self == nil { // its pod runs, but etcd removed the member (it exits) or never added it
		c.mu.Unlock()
		return nil, status.Errorf(codes.Unavailable, "connection refused: %s is not a member", t.member)
	}
	return k, nil
}

func (k *call) done() { k.c.mu.Unlock() }

// running reports whether the member's pod is Ready. Called with the cluster's lock held.
func (k *call) running(ctx context.Context, m *member) bool {
	_, err := k.s.runningPod(ctx, target{cluster: types.NamespacedName{Namespace: k.kvc.Namespace, Name: k.kvc.Name}, member: specs.MemberName(k.kvc, m.ordinal)})
	return err == nil
}

// refresh starts members whose pods run and elects a leader among the running voting members
// when a majority of them runs.
func (k *call) refresh(ctx context.Context) {
	c := k.c
	voting, runningVoters := 0, []*member{}
	var current *member
	for _, m := range c.members {
		up := k.running(ctx, m)
		if up {
			m.started = true
		}
		if m.learner {
			continue
		}
		voting++
		if up {
			runningVoters = append(runningVoters, m)
			if m.id == c.leader {
				current = m
			}
		}
	}
	switch {
	case len(runningVoters) <= voting/2:
		c.leader = 0
	case current == nil:
		c.leader = slices.MinFunc(runningVoters, func(a, b *member) int { return a.ordinal - b.ordinal }).id
		c.term++
	}
}

func (k *call) header() *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: k.c.id, MemberId: k.self.id, Revision: max(k.c.compacted, 1), RaftTerm: k.c.term}
}

func (k *call) requireLeader() error {
	if k.c.leader == 0 {
		return rpctypes.ErrGRPCNoLeader
	}
	return nil
}

func (k *call) member(id uint64) (int, *member) {
	i := slices.IndexFunc(k.c.members, func(m *member) bool { return m.id == id })
	if i < 0 {
		return -1, nil
	}
	return i, k.c.members[i]
}

func (k *call) memberList() []*pb.Member {
	out := make([]*pb.Member, 0, len(k.c.members))
	for _, m := range k.c.members {
		pm := &pb.Member{ID: m.id, PeerURLs: m.peerURLs, IsLearner: m.learner}
		if m.started {
			pm.Name = specs.MemberName(k.kvc, m.ordinal)
			pm.ClientURLs = []string{specs.MemberClientURL(k.kvc, "http", m.ordinal)}
		}
		out = append(out, pm)
	}
	return out
}

// with runs f for a request that a learner refuses, as etcd does every request but Status and
// serializable reads, turning a failure to begin into the answer.
func with[R any](ctx context.Context, s *Sim, f func(k *call) (R, error)) (R, error) {
	return withLearners(ctx, s, func(k *call) (R, error) {
		if k.self.learner {
			var zero R
			return zero, rpctypes.ErrGRPCNotSupportedForLearner
		}
		return f(k)
	})
}

// withLearners runs f for a request that a learner answers too.
func withLearners[R any](ctx context.Context, s *Sim, f func(k *call) (R, error)) (R, error) {
	k, err := s.begin(ctx)
	if err != nil {
		var zero R
		return zero, err
	}
	defer k.done()
	return f(k)
}

type clusterAPI struct {
	s *Sim
	pb.UnimplementedClusterServer
}

func (a clusterAPI) MemberList(ctx context.Context, _ *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	return with(ctx, a.s, func(k *call) (*pb.MemberListResponse, error) {
		if err := k.requireLeader(); err != nil {
			return nil, err
		}
		return &pb.MemberListResponse{Header: k.header(), Members: k.memberList()}, nil
	})
}

func (a clusterAPI) MemberAdd(ctx context.Context, req *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	return with(ctx, a.s, func(k *call) (*pb.MemberAddResponse, error) {
		if err := k.requireLeader(); err != nil {
			return nil, err
		}
		if len(req.PeerURLs) != 1 {
			return nil, status.Error(codes.InvalidArgument, "membersim: one peer URL per member")
		}
		ord, ok := specs.OrdinalOfPeerURL(k.kvc, req.PeerURLs[0])
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "membersim: %s is no member's peer URL", req.PeerURLs[0])
		}
		for _, m := range k.c.members {
			if slices.Contains(m.peerURLs, req.PeerURLs[0]) {
				return nil, rpctypes.ErrGRPCPeerURLExist
			}
		}
		m := &member{id: rand.Uint64() | 1, ordinal: ord, peerURLs: req.PeerURLs, learner: req.IsLearner}
		k.c.members = append(k.c.members, m)
		return &pb.MemberAddResponse{Header: k.header(), Member: &pb.Member{ID: m.id, PeerURLs: m.peerURLs, IsLearner: m.learner}, Members: k.memberList()}, nil
	})
}

func (a clusterAPI) MemberRemove(ctx context.Context, req *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return with(ctx, a.s, func(k *call) (*pb.MemberRemoveResponse, error) {
		if err := k.requireLeader(); err != nil {
			return nil, err
		}
		i, _ := k.member(req.ID)
		if i < 0 {
			return nil, rpctypes.ErrGRPCMemberNotFound
		}
		k.c.members = slices.Delete(k.c.members, i, i+1)
		if k.c.leader == req.ID {
			k.c.leader = 0
		}
		k.refresh(ctx)
		return &pb.MemberRemoveResponse{Header: k.header(), Members: k.memberList()}, nil
	})
}

func (a clusterAPI) MemberUpdate(ctx context.Context, req *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return with(ctx, a.s, func(k *call) (*pb.MemberUpdateResponse, error) {
		if err := k.requireLeader(); err != nil {
			return nil, err
		}
		_, m := k.member(req.ID)
		if m == nil {
			return nil, rpctypes.ErrGRPCMemberNotFound
		}
		m.peerURLs = req.PeerURLs
		return &pb.MemberUpdateResponse{Header: k.header(), Members: k.memberList()}, nil
	})
}

func (a clusterAPI) MemberPromote(ctx context.Context, req *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return with(ctx, a.s, func(k *call) (*pb.MemberPromoteResponse, error) {
		if err := k.requireLeader(); err != nil {
			return nil, err
		}
		_, m := k.member(req.ID)
		switch {
		case m == nil:
			return nil, rpctypes.ErrGRPCMemberNotFound
		case !m.learner:
			return nil, rpctypes.ErrGRPCMemberNotLearner
		case !m.started || !k.running(ctx, m):
			return nil, rpctypes.ErrGRPCLearnerNotReady
		}
		m.learner = false
		return &pb.MemberPromoteResponse{Header: k.header(), Members: k.memberList()}, nil
	})
}

type maintenanceAPI struct {
	s *Sim
	pb.UnimplementedMaintenanceServer
}

func (a maintenanceAPI) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	return withLearners(ctx, a.s, func(k *call) (*pb.StatusResponse, error) {
		resp := &pb.StatusResponse{Header: k.header(), Version: podVersion(k.pod), DbSize: dbSize, DbSizeInUse: dbSize, DbSizeQuota: dbQuota,
			Leader: k.c.leader, RaftIndex: 1000, RaftAppliedIndex: 1000, RaftTerm: k.c.term, IsLearner: k.self.learner}
		for _, al := range k.c.alarms {
			resp.Errors = append(resp.Errors, fmt.Sprintf("memberID:%d alarm:%s ", al.MemberID, al.Alarm))
		}
		return resp, nil
	})
}

// podVersion is the etcd version of the pod's image ("...:v3.7.3" → "3.7.3"): the version the
// member reports is the one its pod runs.
func podVersion(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		if c.Name == "etcd" {
			return strings.TrimPrefix(c.Image[strings.LastIndex(c.Image, ":")+1:], "v")
		}
	}
	return ""
}

func (a maintenanceAPI) Alarm(ctx context.Context, req *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	return with(ctx, a.s, func(k *call) (*pb.AlarmResponse, error) {
		if err := k.requireLeader(); err != nil {
			return nil, err
		}
		matches := func(al *pb.AlarmMember) bool {
			return (req.MemberID == 0 || al.MemberID == req.MemberID) && (req.Alarm == pb.AlarmType_NONE || al.Alarm == req.Alarm)
		}
		switch req.Action {
		case pb.AlarmRequest_ACTIVATE:
			if !slices.ContainsFunc(k.c.alarms, matches) {
				k.c.alarms = append(k.c.alarms, &pb.AlarmMember{MemberID: req.MemberID, Alarm: req.Alarm})
			}
		case pb.AlarmRequest_DEACTIVATE:
			k.c.alarms = slices.DeleteFunc(k.c.alarms, matches)
		}
		return &pb.AlarmResponse{Header: k.header(), Alarms: slices.Clone(k.c.alarms)}, nil
	})
}

func (a maintenanceAPI) MoveLeader(ctx context.Context, req *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	return with(ctx, a.s, func(k *call) (*pb.MoveLeaderResponse, error) {
		if k.c.leader != k.self.id {
			return nil, rpctypes.ErrGRPCNotLeader
		}
		if _, to := k.member(req.TargetID); to == nil || to.learner || !k.running(ctx, to) {
			return nil, rpctypes.ErrGRPCBadLeaderTransferee
		}
		k.c.leader = req.TargetID
		k.c.term++
		return &pb.MoveLeaderResponse{Header: k.header()}, nil
	})
}

func (a maintenanceAPI) Defragment(ctx context.Context, _ *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	return with(ctx, a.s, func(k *call) (*pb.DefragmentResponse, error) {
		return &pb.DefragmentResponse{Header: k.header()}, nil
	})
}

type kvAPI struct {
	s *Sim
	pb.UnimplementedKVServer
}

func (a kvAPI) Compact(ctx context.Context, req *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	return with(ctx, a.s, func(k *call) (*pb.CompactionResponse, error) {
		if err := k.requireLeader(); err != nil {
			return nil, err
		}
		if req.Revision <= k.c.compacted {
			return nil, rpctypes.ErrGRPCCompacted
		}
		k.c.compacted = req.Revision
		return &pb.CompactionResponse{Header: k.header()}, nil
	})
}
