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
// while a running cluster moves between plaintext and TLS. Either way goes in two rolls (members
// restart one at a time in each) through the same step (movingTransport): every member has its peer
// certificate, peers are on plaintext, the client port accepts both schemes (so every client
// keeps a scheme all members accept). Once every member runs so and is ready:
//   - to TLS, peers move to https (each member's peer URL changes as it comes back:
//     planPeerURLs) and the client port becomes the spec's;
//   - back to plaintext (peers came back to http in the first roll), the certificates go.
//
// Every member has its peer certificate while any listens on https: a leader without one cannot
// send a snapshot to a member that fell behind, which then never catches up. The second step is
// taken once and kept (the template says it was taken), so the template never goes back.
func templateTransport(kvc *kvv1.KVCluster, obs Observation) specs.Transport {
	desired, template := specs.DesiredTransport(kvc), obs.STSTransport
	switch {
	case template == nil || *template == desired:
	case desired.PeerTLS && template.PeerTLS: // peers are on TLS; only the client port changes
	case !desired.UsesTLS() && !template.UsesTLS():
	case *template == movingTransport && prepared(obs):
	default:
		return movingTransport
	}
	return desired
}

// movingTransport is how members listen on the way between plaintext and TLS (templateTransport).
var movingTransport = specs.Transport{PeerCerts: true, ClientTLS: true, ClientPlain: true}

// prepared: every member pod the StatefulSet runs is there, ready, on its template, movingTransport.
func prepared(obs Observation) bool {
	if obs.STSReplicas == nil || !obs.STSSettled {
		return false
	}
	for ord := range int(*obs.STSReplicas) {
		p, ok := obs.Pods[ord]
		if !ok || p.Transport == nil || *p.Transport != movingTransport || !p.Ready || p.Terminating || p.Outdated {
			return false
		}
	}
	return true
}

// planPeerURLs finds a member that runs with another peer scheme than etcd's membership has for
// it: restarted on a template that moved peers to TLS, it listens for https only, but its peers
// dial the URL the membership gives. That is changed before anything else moves, and before the
// next member restarts (two members each dialled at the wrong scheme could not reach each other).
// A learner that has not started yet is one too: added just before the template changed.
func planPeerURLs(kvc *kvv1.KVCluster, obs Observation, byOrdinal map[int]members.Member, ordinals []int) (Rollout, bool) {
	for _, ord := range ordinals {
		m := byOrdinal[ord]
		pod, ok := obs.Pods[ord]
		if !ok || pod.Terminating || pod.Transport == nil {
			continue
		}
		want := pod.Transport.MemberPeerURL(kvc, ord)
		if slices.Equal(m.PeerURLs, []string{want}) {
			continue
		}
		return Rollout{Pending: true, Action: ActUpdatePeerURL, Ordinal: ord, MemberID: m.ID, PeerURL: want, Reason: ReasonUpgrading,
			Message: fmt.Sprintf("member %s listens for peers at %s now; changing its peer URL in etcd's membership from %s",
				specs.MemberName(kvc, ord), want, strings.Join(m.PeerURLs, ","))}, true
	}
	return Rollout{}, false
}

// UsesTLS: the template pods come back on, or a member pod, listens with TLS, so needs its
// certificates (a cluster moving back to plaintext still does).
func (o Observation) UsesTLS() bool {
	if o.STSTransport != nil && o.STSTransport.UsesTLS() {
		return true
	}
	for _, p := range o.Pods {
		if p.Transport != nil && p.Transport.UsesTLS() {
			return true
		}
	}
	return false
}

// mayUseTLS: some member may run with TLS, so trusts the CA it started with: UsesTLS, or not
// known (a pod whose flags are unknown may; with no template, nor may anything be told). A
// cluster that only ever ran plaintext can be given its first CA.
func (o Observation) mayUseTLS() bool {
	if o.STSTransport == nil || o.UsesTLS() {
		return true
	}
	for _, p := range o.Pods {
		if p.Transport == nil {
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
