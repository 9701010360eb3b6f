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
//  1. members get their peer certificate, peers still on plaintext, and a client port that
//     accepts both schemes, so every client keeps a scheme all members accept;
//  2. once every member runs so and is ready, peers move to https (each member's peer URL changes
//     as it comes back: planPeerURLs) and the client port becomes the spec's.
//
// Every member has its peer certificate before any listens on https: a leader without one cannot
// send a snapshot to a member that fell behind, which then never catches up. The second step is
// taken once and kept (the template says it was taken), so the template never goes back.
func templateTransport(kvc *kvv1.KVCluster, obs Observation) specs.Transport {
	desired := specs.DesiredTransport(kvc)
	if !desired.PeerTLS || obs.STSTransport == nil || obs.STSTransport.PeerTLS || prepared(obs) {
		return desired
	}
	return specs.Transport{PeerCerts: true, ClientTLS: true, ClientPlain: true}
}

// prepared: every member pod the StatefulSet runs is there, ready, on its template, with its peer
// certificate and a client port that accepts TLS.
func prepared(obs Observation) bool {
	if obs.STSReplicas == nil || !obs.STSSettled || !obs.STSTransport.PeerCerts {
		return false
	}
	for ord := range int(*obs.STSReplicas) {
		p, ok := obs.Pods[ord]
		if !ok || p.Transport == nil || !p.Transport.PeerCerts || !p.Transport.ClientTLS || !p.Ready || p.Terminating || p.Outdated {
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

// membersMayTrustACA: some member may run with TLS, so trusts the CA it started with: a pod with
// its certificates, or the template pods come back on (a pod whose flags are unknown may; with
// no template, nor may anything be told). A cluster that only ever ran plaintext can be given its
// first CA.
func membersMayTrustACA(obs Observation) bool {
	if obs.STSTransport == nil || obs.STSTransport.UsesTLS() {
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
