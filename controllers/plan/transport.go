package plan

import (
	"fmt"
	"slices"
	"strings"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// templateTransport is how the members' template makes them listen: as the spec wants, except
// while a plaintext cluster moves to TLS, in two rolls (members restart one at a time in each):
//  1. while some member lacks its peer certificate, members get it, with peers still on
//     plaintext, and a client port accepting both schemes if some member accepts no client
//     scheme the spec's transport does (so every client keeps a scheme all members accept);
//  2. then peers move to https (each member's peer URL changes as it comes back: planPeerURLs),
//     and the client port becomes the spec's.
//
// A member needs its peer certificate before any peer listens on https: a leader without one
// cannot send a snapshot to a member that fell behind, which then never catches up.
//
// The second roll starts once the first is over (every member back and ready): otherwise the
// member restarted last, not ready yet, would be restarted again at once.
func templateTransport(kvc *kvv1.KVCluster, obs Observation) specs.Transport {
	desired := specs.DesiredTransport(kvc)
	t := desired
	lacksCerts, unready, peersMoving := false, false, false
	for _, p := range obs.Pods {
		if p.Transport == nil {
			continue
		}
		if !p.Transport.Overlaps(desired) {
			t.ClientTLS = t.ClientTLS || p.Transport.ClientTLS
			t.ClientPlain = t.ClientPlain || p.Transport.ClientPlain
		}
		lacksCerts = lacksCerts || !p.Transport.PeerCerts
		unready = unready || !p.Ready || p.Terminating
		peersMoving = peersMoving || p.Transport.PeerTLS
	}
	if desired.PeerTLS && (lacksCerts || (unready && !peersMoving)) {
		t.PeerTLS = false
	}
	return t
}

// planPeerURLs finds a member that runs with another peer scheme than etcd's membership has for
// it: restarted on a template that moved peers to TLS, it listens for https only, but its peers
// dial the URL the membership gives. That is changed before anything else moves, and before the
// next member restarts (two members each dialled at the wrong scheme could not reach each other).
func planPeerURLs(kvc *kvv1.KVCluster, obs Observation, byOrdinal map[int]members.Member, ordinals []int) (Rollout, bool) {
	for _, ord := range ordinals {
		m := byOrdinal[ord]
		pod, ok := obs.Pods[ord]
		if !ok || pod.Terminating || pod.Transport == nil || !m.Started() {
			continue
		}
		want := pod.Transport.MemberPeerURL(kvc, ord)
		if slices.Equal(m.PeerURLs, []string{want}) {
			continue
		}
		return Rollout{Pending: true, Action: ActUpdatePeerURL, Ordinal: ord, MemberID: m.ID, PeerURL: want, Reason: ReasonUpgrading,
			Message: fmt.Sprintf("member %s listens for peers at %s now; changing its peer URL in etcd's membership from %s",
				m.Name, want, strings.Join(m.PeerURLs, ","))}, true
	}
	return Rollout{}, false
}

// membersMayTrustACA: some member may run with TLS, so trusts the CA it started with (a pod whose
// flags are unknown may; with no pod at all, which is unknown too, so may the members that come
// back). A cluster that only ever ran plaintext can be given its first CA.
func membersMayTrustACA(obs Observation) bool {
	if len(obs.Pods) == 0 {
		return true
	}
	for _, p := range obs.Pods {
		if p.Transport == nil || p.Transport.UsesTLS() {
			return true
		}
	}
	return false
}

// transportProgress says, while members listen in different ways, how many listen as the
// template says.
func transportProgress(obs Observation, t specs.Transport) string {
	on := 0
	for _, p := range obs.Pods {
		if p.Transport != nil && *p.Transport == t {
			on++
		}
	}
	if on == len(obs.Pods) {
		return ""
	}
	return fmt.Sprintf("; %d/%d members with %s", on, len(obs.Pods), t)
}
