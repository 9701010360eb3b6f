package members

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// scriptedMember is one member of a two-member cluster (IDs 1 and 2, 1 the leader) that answers
// as its script says.
type scriptedMember struct {
	pb.UnimplementedClusterServer
	pb.UnimplementedMaintenanceServer
	id            uint64
	learner       bool
	statusAfter   time.Duration // how long it takes to answer its status
	listHangs     bool          // a member cut off from the others: the list never comes
	url           string
	urls          map[uint64]string // every member's client URL
	listsAnswered atomic.Int32
}

func (m *scriptedMember) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	time.Sleep(m.statusAfter)
	return &pb.StatusResponse{Header: &pb.ResponseHeader{MemberId: m.id}, Version: "3.7.3", Leader: 1, IsLearner: m.learner}, nil
}

func (m *scriptedMember) MemberList(ctx context.Context, _ *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	switch {
	case m.learner: // as etcd refuses every request but Status and serializable reads on a learner
		return nil, rpctypes.ErrGRPCNotSupportedForLearner
	case m.listHangs:
		<-ctx.Done()
		return nil, ctx.Err()
	}
	m.listsAnswered.Add(1)
	out := &pb.MemberListResponse{Header: &pb.ResponseHeader{MemberId: m.id}}
	for id := uint64(1); id <= 2; id++ {
		out.Members = append(out.Members, &pb.Member{ID: id, Name: map[uint64]string{1: "kv-0", 2: "kv-1"}[id], ClientURLs: []string{m.urls[id]}, IsLearner: id == 2 && m.learner})
	}
	return out, nil
}

func serveScripted(t *testing.T, ms ...*scriptedMember) {
	t.Helper()
	urls := map[uint64]string{}
	for _, m := range ms {
		m.url = serveMember(t, m)
		urls[m.id] = m.url
	}
	for _, m := range ms {
		m.urls = urls
	}
}

// The member list is read through a voting member: a learner answering its status first, or a
// voter whose list does not come, leaves it to the next voter that answered.
func TestTheMemberListIsReadThroughAVoterThatLists(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first *scriptedMember // answers its status at once
	}{
		{"a learner answers first", &scriptedMember{id: 2, learner: true}},
		{"a voter cut off from the others answers first", &scriptedMember{id: 2, listHangs: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, voter := tc.first, &scriptedMember{id: 1, statusAfter: 300 * time.Millisecond}
			serveScripted(t, first, voter)
			urlOf := func(m Member) (string, bool) { return first.urls[m.ID], true }
			for _, pool := range []*Pool{nil, NewPool(time.Minute, 10)} {
				c, err := EtcdClient{Timeout: 5 * time.Second, Pool: pool}.Cluster(context.Background(), []string{first.url, voter.url}, urlOf)
				if err != nil {
					t.Fatalf("pool %v: %v", pool != nil, err)
				}
				if len(c.Members) != 2 || !c.Members[0].Healthy || !c.Members[1].Healthy || !c.HasLeader {
					t.Errorf("pool %v: %+v", pool != nil, c)
				}
			}
			if n := voter.listsAnswered.Load(); n != 2 {
				t.Errorf("the voter listed the members %d times, want 2", n)
			}
		})
	}
}

// Once the deadline has passed, a voter that answered is not asked for the list: the request
// would fail before it left, and its pooled client would be dropped as if the member had not
// answered.
func TestNoMemberIsAskedForTheListPastTheDeadline(t *testing.T) {
	cutOff, voter := &scriptedMember{id: 2, listHangs: true}, &scriptedMember{id: 1, statusAfter: 300 * time.Millisecond}
	serveScripted(t, cutOff, voter)
	pool := NewPool(time.Minute, 10)
	// The whole look gets less than one list attempt's 2 s: the cut-off member's uses it up.
	e := EtcdClient{Timeout: time.Second, Pool: pool}
	if _, err := e.Cluster(context.Background(), []string{cutOff.url, voter.url}, func(m Member) (string, bool) { return cutOff.urls[m.ID], true }); err == nil {
		t.Fatal("the list came through a member cut off from the others")
	}
	// The cut-off member's client went unanswered and left the pool; the voter's answered its status.
	if n := pool.Len(); n != 1 {
		t.Errorf("the pool holds %d clients after the deadline, want 1 (the voter's)", n)
	}
}
