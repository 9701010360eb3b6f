// Package members asks etcd itself about a cluster's membership and health. The controller uses it
// through the Client interface, so tests without real etcd members can substitute a fake.
package members

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Member is one etcd member as the cluster reports it.
type Member struct {
	ID      uint64
	Name    string
	Learner bool
	// Healthy is true when the member answered a status request.
	Healthy bool
	Leader  bool
	// Version is the etcd server version the member itself reports.
	Version  string
	Revision int64
}

// Cluster is the cluster's view of itself.
type Cluster struct {
	// Members from the member list (agreed by a quorum), sorted by name.
	Members []Member
	// HasLeader is true when some member reports a leader and a linearizable request succeeded.
	HasLeader bool
}

// Voting counts the members that vote (are not learners).
func (c Cluster) Voting() int {
	n := 0
	for _, m := range c.Members {
		if !m.Learner {
			n++
		}
	}
	return n
}

// AllHealthy reports whether every member answered.
func (c Cluster) AllHealthy() bool {
	for _, m := range c.Members {
		if !m.Healthy {
			return false
		}
	}
	return len(c.Members) > 0
}

// Client reads a cluster's membership and health through the members' client URLs.
type Client interface {
	Cluster(ctx context.Context, endpoints []string) (Cluster, error)
}

// ErrNoQuorum means the member list could not be read: no quorum answered.
var ErrNoQuorum = errors.New("etcd did not answer a linearizable request (no quorum or no member reachable)")

// EtcdClient is the Client talking to real etcd members.
type EtcdClient struct {
	// Timeout bounds the whole query.
	Timeout time.Duration
}

// Cluster lists the members with a linearizable request (which only a quorum can answer), then
// asks each member for its own status.
func (e EtcdClient) Cluster(ctx context.Context, endpoints []string) (Cluster, error) {
	timeout := e.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: timeout,
		Logger:      zap.NewNop(),
		Context:     ctx,
	})
	if err != nil {
		return Cluster{}, fmt.Errorf("connect to etcd at %s: %w", strings.Join(endpoints, ","), err)
	}
	defer func() { _ = cli.Close() }()

	list, err := cli.MemberList(ctx)
	if err != nil {
		return Cluster{}, fmt.Errorf("%w: %v", ErrNoQuorum, err)
	}
	var out Cluster
	for _, m := range list.Members {
		mem := Member{ID: m.ID, Name: m.Name, Learner: m.IsLearner}
		if len(m.ClientURLs) > 0 {
			st, err := cli.Status(ctx, m.ClientURLs[0])
			if err == nil {
				mem.Healthy = true
				mem.Version = st.Version
				mem.Revision = st.Header.Revision
				mem.Leader = st.Leader == m.ID
				if st.Leader != 0 {
					out.HasLeader = true
				}
			}
		}
		out.Members = append(out.Members, mem)
	}
	slices.SortFunc(out.Members, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
