package members

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
)

// hostileEtcd answers etcd's member list and status requests as a member under someone else's
// control would: advertising a client URL of its choice, padding its answers.
type hostileEtcd struct {
	pb.UnimplementedClusterServer
	pb.UnimplementedMaintenanceServer
	url        string // where it really listens
	advertised string // the client URL it advertises
	padding    int    // bytes of peer URLs added to the member list
	memberID   uint64 // the ID it answers status with (default 1, the listed member's)
}

func (h *hostileEtcd) MemberList(context.Context, *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	m := &pb.Member{ID: 1, Name: "kv-0", PeerURLs: []string{"http://kv-0.kv-peer.ns.svc:2380"}, ClientURLs: []string{h.advertised}}
	if h.padding > 0 {
		m.PeerURLs = append(m.PeerURLs, strings.Repeat("x", h.padding))
	}
	return &pb.MemberListResponse{Header: &pb.ResponseHeader{MemberId: 1}, Members: []*pb.Member{m}}, nil
}

func (h *hostileEtcd) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	id := max(h.memberID, 1)
	return &pb.StatusResponse{Header: &pb.ResponseHeader{MemberId: id, Revision: 7}, Version: "3.7.3", Leader: id, RaftIndex: 9, RaftAppliedIndex: 9}, nil
}

func serve(t *testing.T, h *hostileEtcd) {
	t.Helper()
	h.url = serveMember(t, h)
}

// fakeMember is a stand-in for an etcd member: its cluster and maintenance APIs.
type fakeMember interface {
	pb.ClusterServer
	pb.MaintenanceServer
}

// serveMember serves m on a loopback port until the test ends and returns its client URL.
func serveMember(t *testing.T, m fakeMember) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.MaxSendMsgSize(64 << 20))
	pb.RegisterClusterServer(s, m)
	pb.RegisterMaintenanceServer(s, m)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return "http://" + l.Addr().String()
}

// connectionCounter is a listener that only counts who connects.
func connectionCounter(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	var n atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_ = c.Close()
		}
	}()
	return "http://" + l.Addr().String(), &n
}

// TestMembersAreAskedOnlyWhereTheOperatorSays: a member's image decides the client URL it
// advertises; the operator must dial only the URL it computes for that member, and members it
// cannot place are not dialled at all.
func TestMembersAreAskedOnlyWhereTheOperatorSays(t *testing.T) {
	elsewhere, dialled := connectionCounter(t)
	h := &hostileEtcd{advertised: elsewhere}
	serve(t, h)
	known := func(m Member) (string, bool) { return h.url, m.Name == "kv-0" }
	c, err := EtcdClient{Timeout: 5 * time.Second}.Cluster(context.Background(), []string{h.url}, known)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Members) != 1 || !c.Members[0].Healthy || !c.HasLeader {
		t.Errorf("members = %+v, want kv-0 healthy and leading (asked at the computed URL)", c.Members)
	}
	unknown := func(Member) (string, bool) { return "", false }
	if c, err = (EtcdClient{Timeout: 5 * time.Second}).Cluster(context.Background(), []string{h.url}, unknown); err != nil {
		t.Fatal(err)
	}
	if c.Members[0].Healthy {
		t.Error("a member the operator cannot place must not be asked")
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("the advertised client URL %s was dialled %d times", elsewhere, n)
	}
	// Whoever answers at a member's URL must be that member.
	impostor := &hostileEtcd{}
	serve(t, impostor)
	otherAnswers := func(Member) (string, bool) { return impostor.url, true }
	impostor.memberID = 2
	if c, err = (EtcdClient{Timeout: 5 * time.Second}).Cluster(context.Background(), []string{h.url}, otherAnswers); err != nil {
		t.Fatal(err)
	}
	if c.Members[0].Healthy {
		t.Error("a member was taken as healthy on the status of another member (ID 2) answering at its URL")
	}
}

// TestAnswersFromMembersAreBounded: a member answering with megabytes is refused, not read into
// the memory every cluster's reconcile shares.
func TestAnswersFromMembersAreBounded(t *testing.T) {
	h := &hostileEtcd{padding: 8 << 20}
	serve(t, h)
	h.advertised = h.url
	_, err := EtcdClient{Timeout: 5 * time.Second}.Cluster(context.Background(), []string{h.url}, func(Member) (string, bool) { return h.url, true })
	if err == nil || !strings.Contains(err.Error(), "larger than max") {
		t.Errorf("an 8 MiB member list was accepted (error %v); want it refused as too large", err)
	}
}

// TestClassify: etcd's transient refusals of a membership change become the sentinel errors the
// controller waits on (keeping etcd's own words), whether they arrive as the client's error, as
// the raw gRPC status or wrapped; every other error, and no error, is returned as it is.
func TestClassify(t *testing.T) {
	sentinels := []error{ErrNoQuorum, ErrLearnerNotReady, ErrNotNow}
	tests := []struct {
		name string
		err  error
		// want is the sentinel the result must match; nil: err is returned unchanged.
		want error
	}{
		{name: "no error", err: nil, want: nil},
		{name: "learner behind, as the client returns it", err: rpctypes.ErrMemberLearnerNotReady, want: ErrLearnerNotReady},
		{name: "learner behind, as a gRPC status", err: rpctypes.ErrGRPCLearnerNotReady, want: ErrLearnerNotReady},
		{name: "learner behind, wrapped", err: fmt.Errorf("promote member 7: %w", rpctypes.ErrMemberLearnerNotReady), want: ErrLearnerNotReady},
		{name: "member restarted moments ago, as the client returns it", err: rpctypes.ErrUnhealthy, want: ErrNotNow},
		{name: "member restarted moments ago, as a gRPC status", err: rpctypes.ErrGRPCUnhealthy, want: ErrNotNow},
		{name: "member restarted moments ago, wrapped", err: fmt.Errorf("remove member 7: %w", rpctypes.ErrUnhealthy), want: ErrNotNow},
		{name: "other refusal: too many learners", err: rpctypes.ErrTooManyLearners, want: nil},
		{name: "other refusal: not a learner", err: rpctypes.ErrMemberNotLearner, want: nil},
		{name: "other refusal: member not found", err: rpctypes.ErrMemberNotFound, want: nil},
		{name: "out of time", err: fmt.Errorf("add learner: %w", context.DeadlineExceeded), want: nil},
		{name: "unreachable", err: errors.New("connect to etcd at http://kv-0.kv-peer.prod.svc:2379: connection refused"), want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := classify(tt.err)
			if tt.want == nil {
				if got != tt.err {
					t.Fatalf("classify(%v) = %v, want it unchanged", tt.err, got)
				}
			} else {
				if !errors.Is(got, tt.want) {
					t.Errorf("classify(%v) = %v, want %v", tt.err, got, tt.want)
				}
				if !strings.Contains(got.Error(), tt.err.Error()) {
					t.Errorf("classify(%v) = %q, which lost etcd's own words", tt.err, got)
				}
			}
			for _, s := range sentinels {
				if s != tt.want && errors.Is(got, s) {
					t.Errorf("classify(%v) = %v, which also matches %v", tt.err, got, s)
				}
			}
		})
	}
}
