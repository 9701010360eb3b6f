// Package members asks etcd itself about a cluster's membership and health. The controller uses it
// through the Client interface, so tests without real etcd members can substitute a fake.
package members

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
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
	// PeerURLs identify the member before it has started (an added member has no name yet).
	PeerURLs   []string
	ClientURLs []string
	// RaftIndex is the member's last raft log index; AppliedIndex how far it has applied it.
	RaftIndex    uint64
	AppliedIndex uint64
	// DBSize is the size of the member's database file, DBSizeInUse the part holding data, and
	// DBSizeQuota the size at which etcd raises the NOSPACE alarm (bytes).
	DBSize, DBSizeInUse, DBSizeQuota int64
}

// Started reports whether the member has run and published its name; a member just added to the
// list has not.
func (m Member) Started() bool { return m.Name != "" }

// Cluster is the cluster's view of itself.
type Cluster struct {
	// Members from the member list (agreed by a quorum), sorted by name.
	Members []Member
	// HasLeader is true when some member reports a leader and a linearizable request succeeded.
	HasLeader bool
	// Alarms etcd has raised. Under a NOSPACE alarm etcd refuses writes.
	Alarms []Alarm
}

// Alarm is an alarm etcd raised for one member: NOSPACE (its database reached the quota, or
// writes were fenced) or CORRUPT.
type Alarm struct {
	MemberID uint64
	Type     string
}

// StaleAlarms are the alarms of members the cluster no longer has: a cluster restored from a
// snapshot starts with the alarms of the cluster the snapshot was taken from (a final backup is
// taken with writes fenced by a NOSPACE alarm), and would refuse writes for ever.
func (c Cluster) StaleAlarms() []Alarm {
	var stale []Alarm
	for _, a := range c.Alarms {
		if !slices.ContainsFunc(c.Members, func(m Member) bool { return m.ID == a.MemberID }) {
			stale = append(stale, a)
		}
	}
	return stale
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

// Leader is the member that leads, if any answered as leader.
func (c Cluster) Leader() (Member, bool) {
	for _, m := range c.Members {
		if m.Leader && m.Healthy {
			return m, true
		}
	}
	return Member{}, false
}

// Client reads a cluster's membership and health, and changes its membership, through the
// members' client URLs.
type Client interface {
	// Cluster asks the members at endpoints for their status and reads the member list through
	// one that answered; a listed member's status is the answer at the URL urlOf gives: members
	// urlOf does not know are not asked (and count as not healthy). A member's self-advertised URL
	// is never dialled: what a member's image advertises must not decide where the operator
	// connects.
	Cluster(ctx context.Context, endpoints []string, urlOf func(Member) (string, bool)) (Cluster, error)
	// NotNeededFor says the members at endpoints will not be asked again for next (the cluster's
	// next look): connections kept open for a request soon after may be closed now.
	NotNeededFor(endpoints []string, next time.Duration)
	// MoveLeader asks the leader, at leaderEndpoint, to hand leadership to the member to.
	MoveLeader(ctx context.Context, leaderEndpoint string, to uint64) error
	// AddLearner adds a non-voting member with the given peer URL and returns its ID.
	AddLearner(ctx context.Context, endpoints []string, peerURL string) (uint64, error)
	// Promote makes a learner a voting member; ErrLearnerNotReady while it is behind.
	Promote(ctx context.Context, endpoints []string, id uint64) error
	// Remove takes a member out of the cluster. Send it through the other members: the member
	// being removed answers "server stopped" even when the removal was applied.
	Remove(ctx context.Context, endpoints []string, id uint64) error
	// FenceWrites makes the cluster refuse writes from now on: it raises the NOSPACE alarm, under
	// which etcd refuses puts, transactions with writes and lease grants (deletes still pass). It
	// returns the revision writes stopped at.
	FenceWrites(ctx context.Context, endpoints []string) (int64, error)
	// DisarmAlarm clears an alarm.
	DisarmAlarm(ctx context.Context, endpoints []string, a Alarm) error
	// Compact drops every revision before revision, once the members have applied it to their
	// databases (freeing pages in them, not on disk: see Defragment). It reports false when the
	// cluster was compacted that far already.
	Compact(ctx context.Context, endpoints []string, revision int64) (bool, error)
	// Defragment rewrites one member's database without its free pages, returning them to the
	// disk. The member serves no request while it does.
	Defragment(ctx context.Context, memberEndpoint string) error
	// UpdatePeerURL changes the peer URL the other members dial a member at.
	UpdatePeerURL(ctx context.Context, endpoints []string, id uint64, peerURL string) error
	// WithTLS is the client for a cluster with TLS: it presents the cluster's client certificate
	// and trusts only its CA (nil: plaintext).
	WithTLS(config *tls.Config) Client
}

var (
	// ErrNoQuorum means the member list could not be read: no quorum answered.
	ErrNoQuorum = errors.New("etcd did not answer a linearizable request (no quorum or no member reachable)")
	// ErrLearnerNotReady means a learner is not yet in sync with the leader; promote it later.
	ErrLearnerNotReady = errors.New("the learner is not yet in sync with the leader")
	// ErrNotNow means etcd refused a membership change for now: a member was restarted moments ago
	// (etcd's strict reconfiguration check wants every voting member connected for a while).
	ErrNotNow = errors.New("etcd refuses membership changes until every member has been connected for a while")
)

// classify turns etcd's transient refusals into the sentinel errors above.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case strings.Contains(err.Error(), rpctypes.ErrMemberLearnerNotReady.Error()):
		return fmt.Errorf("%w: %v", ErrLearnerNotReady, err)
	case strings.Contains(err.Error(), rpctypes.ErrUnhealthy.Error()):
		return fmt.Errorf("%w: %v", ErrNotNow, err)
	}
	return err
}

// memberStatusTimeout bounds the status request to one member.
const memberStatusTimeout = 2 * time.Second

// maxResponseBytes bounds every answer read from a member. The operator's requests (member list,
// status, membership changes) are answered in a few kilobytes; a member answering more is broken
// or hostile and must not exhaust the operator's memory, which every cluster shares.
const maxResponseBytes = 256 << 10

// EtcdClient is the Client talking to real etcd members.
type EtcdClient struct {
	// Timeout bounds the whole query.
	Timeout time.Duration
	// TLS is the client configuration for a cluster with TLS; nil for plaintext.
	TLS *tls.Config
	// DialOptions are added to every connection's (the fleet benchmark routes them to simulated
	// members).
	DialOptions []grpc.DialOption
	// Pool keeps clients of one member open between requests; nil: a client per request.
	Pool *Pool
}

// WithTLS returns a copy that speaks TLS with config.
func (e EtcdClient) WithTLS(config *tls.Config) Client {
	e.TLS = config
	return e
}

// Cluster asks each member at endpoints for its own status and, through the first voting member
// with a leader that answers, lists the members with a linearizable request (which only a quorum
// can answer; etcd refuses it on a learner, and a member without a leader would hold it until its
// deadline); if that member does not list them in time, the next one that answered is asked.
// Every request goes through a client of one member: the list goes through a connection that just
// carried an answer, where a client of several endpoints could route it to a member that stopped
// answering since its connection was made.
func (e EtcdClient) Cluster(ctx context.Context, endpoints []string, urlOf func(Member) (string, bool)) (Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, e.timeout())
	defer cancel()
	asked := e.askStatus(ctx, endpoints)
	answers := map[string]*clientv3.StatusResponse{}
	through := ""
	var list *clientv3.MemberListResponse
	var listErr error
	for a := range asked {
		if a.status == nil {
			continue
		}
		answers[a.url] = a.status
		if a.status.IsLearner || a.status.Leader == 0 || (listErr != nil && ctx.Err() != nil) {
			continue // past the deadline, another member would not be asked, only dropped from the pool
		}
		through = a.url
		if list, listErr = e.memberList(ctx, through); listErr == nil {
			break
		}
	}
	switch {
	case len(answers) == 0:
		return Cluster{}, fmt.Errorf("%w: no member answered at %s", ErrNoQuorum, strings.Join(endpoints, ","))
	case through == "":
		return Cluster{}, fmt.Errorf("%w: no voting member with a leader answered at %s", ErrNoQuorum, strings.Join(endpoints, ","))
	case listErr != nil:
		return Cluster{}, fmt.Errorf("%w: %v", ErrNoQuorum, listErr)
	}
	out := Cluster{Members: make([]Member, len(list.Members))}
	urls := make([]string, len(list.Members))
	var more []string // members whose URL was not among endpoints
	for i, m := range list.Members {
		out.Members[i] = Member{ID: m.ID, Name: m.Name, Learner: m.IsLearner, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs}
		url, known := urlOf(out.Members[i])
		if len(m.ClientURLs) == 0 || !known { // not started yet, or none of the cluster's pods
			continue
		}
		urls[i] = url
		if !slices.Contains(endpoints, url) && !slices.Contains(more, url) {
			more = append(more, url)
		}
	}
	for a := range asked { // the other members' answers, while the list was read
		answers[a.url] = a.status
	}
	for a := range e.askStatus(ctx, more) {
		answers[a.url] = a.status
	}
	alarmed := false
	for i, m := range list.Members {
		st := answers[urls[i]]
		if urls[i] == "" || st == nil || st.Header.MemberId != m.ID { // someone else answers there: not this member
			continue
		}
		alarmed = alarmed || len(st.Errors) > 0
		mem := &out.Members[i]
		mem.Healthy = true
		mem.Version = st.Version
		mem.Revision = st.Header.Revision
		mem.Leader = st.Leader == m.ID
		mem.RaftIndex, mem.AppliedIndex = st.RaftIndex, st.RaftAppliedIndex
		mem.DBSize, mem.DBSizeInUse, mem.DBSizeQuota = st.DbSize, st.DbSizeInUse, st.DbSizeQuota
		out.HasLeader = out.HasLeader || mem.Leader
	}
	// A member lists the alarms in its status errors; only then is the alarm list (a request
	// through raft) read.
	if alarmed {
		err := e.do(ctx, []string{through}, func(ctx context.Context, cli *clientv3.Client) error {
			resp, err := cli.AlarmList(ctx)
			if err == nil {
				for _, a := range resp.Alarms {
					out.Alarms = append(out.Alarms, Alarm{MemberID: a.MemberID, Type: a.Alarm.String()})
				}
			}
			return err
		})
		if err != nil {
			return Cluster{}, fmt.Errorf("%w: list alarms: %v", ErrNoQuorum, err)
		}
	}
	slices.SortFunc(out.Members, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// memberList lists the members through the member at url, within memberStatusTimeout: a member
// cut off from the others may still believe in its leader, and another is left to ask.
func (e EtcdClient) memberList(ctx context.Context, url string) (list *clientv3.MemberListResponse, err error) {
	ctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
	defer cancel()
	err = e.do(ctx, []string{url}, func(ctx context.Context, cli *clientv3.Client) error {
		list, err = cli.MemberList(ctx)
		return err
	})
	return list, err
}

// statusOf asks the member at url, which cli's connection reaches, for its status: through the
// Maintenance client of that connection (cli.Status(url) would dial anew), with cli's call
// options (the answer's size bound); not retried: a member that does not answer at once is asked
// again on the next reconcile.
func statusOf(ctx context.Context, cli *clientv3.Client, url string) (*clientv3.StatusResponse, error) {
	return clientv3.NewMaintenanceFromMaintenanceClient(pb.NewMaintenanceClient(cli.ActiveConnection()), cli).Status(ctx, url)
}

// memberStatus is a member's answer to a status request at url; nil if it did not answer.
type memberStatus struct {
	url    string
	status *clientv3.StatusResponse
}

// askStatus asks each member at urls for its status, all at once, each with its own deadline: a
// member that hangs (a crash-looping pod) must not make the ones asked after it look unhealthy.
// The answers come as they arrive; the channel closes after the last.
func (e EtcdClient) askStatus(ctx context.Context, urls []string) <-chan memberStatus {
	urls = slices.Compact(slices.Sorted(slices.Values(urls))) // a member asked twice would answer twice
	out := make(chan memberStatus, len(urls))
	var wg sync.WaitGroup
	for _, url := range urls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
			defer cancel()
			answer := memberStatus{url: url}
			_ = e.do(ctx, []string{url}, func(ctx context.Context, cli *clientv3.Client) (err error) {
				answer.status, err = statusOf(ctx, cli, url)
				return err
			})
			out <- answer
		})
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out
}

func (e EtcdClient) timeout() time.Duration {
	if e.Timeout == 0 {
		return 5 * time.Second
	}
	return e.Timeout
}

// connect returns a client for endpoints, from the pool if there is one, and the function to
// call with the request's outcome once done with it.
func (e EtcdClient) connect(ctx context.Context, endpoints []string) (*clientv3.Client, func(error), error) {
	dial := func(ctx context.Context) (*clientv3.Client, error) {
		cli, err := clientv3.New(clientv3.Config{
			Endpoints:          endpoints,
			TLS:                e.TLS,
			DialTimeout:        e.timeout(),
			Logger:             zap.NewNop(),
			Context:            ctx,
			MaxCallRecvMsgSize: maxResponseBytes,
			DialOptions:        e.DialOptions,
		})
		if err != nil {
			return nil, fmt.Errorf("connect to etcd at %s: %w", strings.Join(endpoints, ","), err)
		}
		return cli, nil
	}
	// Only clients of one member are pooled: those ask every member for its status on each look.
	// A client of several (membership changes, fencing) serves a rare request and would hold a
	// connection to each.
	if e.Pool == nil || len(endpoints) != 1 {
		cli, err := dial(ctx)
		if err != nil {
			return nil, nil, err
		}
		return cli, func(error) { _ = cli.Close() }, nil
	}
	// A pooled client outlives the request: its own context, never the request's (the client
	// connects when first asked; each request's context bounds it).
	return e.Pool.acquire(endpoints, e.TLS, func() (*clientv3.Client, error) { return dial(context.Background()) })
}

// NotNeededFor closes the pooled clients of the members at endpoints now, rather than after the
// pool's idle time, when next is longer.
func (e EtcdClient) NotNeededFor(endpoints []string, next time.Duration) {
	if e.Pool != nil {
		e.Pool.notNeededFor(endpoints, e.TLS, next)
	}
}

// do runs one request against the cluster, bounded by the timeout.
func (e EtcdClient) do(ctx context.Context, endpoints []string, f func(ctx context.Context, cli *clientv3.Client) error) error {
	return e.doWithin(ctx, e.timeout(), endpoints, f)
}

// doWithin is do for a request that may take longer than the timeout (which still bounds the dial).
func (e EtcdClient) doWithin(ctx context.Context, within time.Duration, endpoints []string, f func(ctx context.Context, cli *clientv3.Client) error) (err error) {
	ctx, cancel := context.WithTimeout(ctx, max(within, e.timeout()))
	defer cancel()
	cli, release, err := e.connect(ctx, endpoints)
	if err != nil {
		return err
	}
	defer func() { release(err) }()
	return f(ctx, cli)
}

// MoveLeader must reach the leader itself, so its client has the leader's endpoint only.
func (e EtcdClient) MoveLeader(ctx context.Context, leaderEndpoint string, to uint64) error {
	return e.do(ctx, []string{leaderEndpoint}, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.MoveLeader(ctx, to)
		return err
	})
}

func (e EtcdClient) AddLearner(ctx context.Context, endpoints []string, peerURL string) (uint64, error) {
	var id uint64
	err := e.do(ctx, endpoints, func(ctx context.Context, cli *clientv3.Client) error {
		resp, err := cli.MemberAddAsLearner(ctx, []string{peerURL})
		if err == nil {
			id = resp.Member.ID
		}
		return err
	})
	return id, classify(err)
}

func (e EtcdClient) Promote(ctx context.Context, endpoints []string, id uint64) error {
	return classify(e.do(ctx, endpoints, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.MemberPromote(ctx, id)
		return err
	}))
}

func (e EtcdClient) FenceWrites(ctx context.Context, endpoints []string) (int64, error) {
	var revision int64
	err := e.do(ctx, endpoints, func(ctx context.Context, cli *clientv3.Client) error {
		list, err := cli.MemberList(ctx) // linearizable: the alarm goes to a cluster with a quorum
		if err != nil {
			return err
		}
		resp, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx,
			&pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: list.Header.MemberId, Alarm: pb.AlarmType_NOSPACE})
		if err == nil {
			revision = resp.Header.Revision
		}
		return err
	})
	return revision, err
}

func (e EtcdClient) DisarmAlarm(ctx context.Context, endpoints []string, a Alarm) error {
	return e.do(ctx, endpoints, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: pb.AlarmType(pb.AlarmType_value[a.Type])})
		return err
	})
}

func (e EtcdClient) Compact(ctx context.Context, endpoints []string, revision int64) (bool, error) {
	err := e.doWithin(ctx, maintenanceTimeout, endpoints, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Compact(ctx, revision, clientv3.WithCompactPhysical())
		return err
	})
	if errors.Is(err, rpctypes.ErrCompacted) {
		return false, nil
	}
	return err == nil, err
}

// maintenanceTimeout bounds a compaction (waiting until the members applied it) and one member's
// defragmentation: etcd rewrites the whole database file, about a second per 70 MB.
const maintenanceTimeout = 2 * time.Minute

func (e EtcdClient) Defragment(ctx context.Context, memberEndpoint string) error {
	return e.doWithin(ctx, maintenanceTimeout, []string{memberEndpoint}, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Defragment(ctx, memberEndpoint)
		return err
	})
}

func (e EtcdClient) UpdatePeerURL(ctx context.Context, endpoints []string, id uint64, peerURL string) error {
	return classify(e.do(ctx, endpoints, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.MemberUpdate(ctx, id, []string{peerURL})
		return err
	}))
}

func (e EtcdClient) Remove(ctx context.Context, endpoints []string, id uint64) error {
	return classify(e.do(ctx, endpoints, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.MemberRemove(ctx, id)
		return err
	}))
}
