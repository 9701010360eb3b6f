package plan

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// listening gives every pod of the scenario the transport t.
func (s *scenario) listening(t specs.Transport) *scenario {
	for i, p := range s.obs.Pods {
		p.Transport = &t
		s.obs.Pods[i] = p
	}
	return s
}

var (
	plaintext = specs.Transport{ClientPlain: true}
	prepared  = specs.Transport{PeerCerts: true, ClientTLS: true, ClientPlain: true}
	both      = specs.Transport{PeerTLS: true, PeerCerts: true, ClientTLS: true, ClientPlain: true}
	tlsOnly   = specs.Transport{PeerTLS: true, PeerCerts: true, ClientTLS: true}
)

// TestMovingToTLS plays a running plaintext cluster's move to TLS step by step, acting as the
// operator and the StatefulSet controller would: a restarted pod runs the template of the moment,
// a peer URL change is applied, leadership moves. It checks what a user relies on at every step:
// every member accepts the scheme clients are told to use (status.clientEndpoint, the operator's
// own client, backup Jobs); no member restarts while another is dialled at a scheme it does
// not listen for (two such members could not reach each other, and a third restart would lose
// the quorum); no member listens for peers on https while another has no peer certificate (as
// leader, that one could not send it a snapshot).
func TestMovingToTLS(t *testing.T) {
	tests := []struct {
		name       string
		clients    kvv1.PlaintextClients
		wantRolls  []specs.Transport
		wantScheme string
	}{
		{name: "clients refused in plaintext: certificates and both client schemes first, then TLS only", clients: "",
			wantRolls: []specs.Transport{prepared, tlsOnly}, wantScheme: "https"},
		{name: "plaintext clients accepted: certificates first, then peers on TLS", clients: kvv1.PlaintextClientsAccept,
			wantRolls: []specs.Transport{prepared, both}, wantScheme: "https"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := formed(3, "3.7.3").listening(plaintext)
			s.kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator, PlaintextClients: tt.clients}
			var rolls []specs.Transport
			var steps []string
			template := specs.Transport{}
			for pass := 0; ; pass++ {
				if pass > 40 {
					t.Fatalf("no end after 40 steps: %s", strings.Join(steps, "; "))
				}
				if now := templateTransport(s.kvc, s.obs); now != template {
					template = now
					rolls = append(rolls, now)
					for i, p := range s.obs.Pods { // the StatefulSet controller sees a new template
						p.Outdated = *p.Transport != template
						s.obs.Pods[i] = p
					}
				}
				scheme := s.obs.ClientScheme(s.kvc)
				for ord, p := range s.obs.Pods {
					if accepts := map[string]bool{"https": p.Transport.ClientTLS, "http": p.Transport.ClientPlain}[scheme]; !accepts {
						t.Fatalf("after %s: clients are told to use %s, which member %d (%s) refuses", strings.Join(steps, "; "), scheme, ord, p.Transport)
					}
				}
				for ord, p := range s.obs.Pods {
					for other, q := range s.obs.Pods {
						if p.Transport.PeerTLS && !q.Transport.PeerCerts {
							t.Fatalf("after %s: member %d listens for peers on https, member %d has no peer certificate to reach it", strings.Join(steps, "; "), ord, other)
						}
					}
				}
				ro := planRollout(s.kvc, s.obs)
				if !ro.Pending {
					break
				}
				name := fmt.Sprintf("kv-%d", ro.Ordinal)
				switch ro.Action {
				case ActRestartPod:
					for ord, p := range s.obs.Pods {
						if want := p.Transport.MemberPeerURL(s.kvc, ord); !slices.Equal(s.member(ord).PeerURLs, []string{want}) {
							t.Fatalf("after %s: %s restarts while member %d is dialled at %v but listens at %s", strings.Join(steps, "; "), name, ord, s.member(ord).PeerURLs, want)
						}
					}
					p := s.obs.Pods[ro.Ordinal]
					tr := template
					p.Transport, p.Outdated = &tr, false
					s.obs.Pods[ro.Ordinal] = p
					steps = append(steps, "restart "+name)
				case ActUpdatePeerURL:
					s.member(ro.Ordinal).PeerURLs = []string{ro.PeerURL}
					steps = append(steps, "update "+name+" "+ro.PeerURL)
				case ActMoveLeader:
					s.leader(int(ro.To - 1))
					steps = append(steps, fmt.Sprintf("move leader to kv-%d", ro.To-1))
				default:
					t.Fatalf("after %s: unexpected step %v: %s", strings.Join(steps, "; "), ro.Action, ro.Message)
				}
			}
			t.Logf("steps: %s", strings.Join(steps, "; "))
			if !slices.Equal(rolls, tt.wantRolls) {
				t.Errorf("templates %v, want %v", rolls, tt.wantRolls)
			}
			if got := s.obs.ClientScheme(s.kvc); got != tt.wantScheme {
				t.Errorf("clients use %s at the end, want %s", got, tt.wantScheme)
			}
			for ord := range 3 {
				if got, want := s.member(ord).PeerURLs, specs.MemberPeerURL(s.kvc, ord); !slices.Equal(got, []string{want}) {
					t.Errorf("member %d has peer URLs %v, want %s", ord, got, want)
				}
			}
		})
	}
}

func TestClientScheme(t *testing.T) {
	tlsCluster := func() *kvv1.KVCluster {
		k := kvcIn(kvv1.PhaseReady, 0)
		k.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
		return k
	}
	pods := func(ts ...specs.Transport) map[int]Pod {
		m := map[int]Pod{}
		for i, t := range ts {
			m[i] = Pod{Transport: &t}
		}
		return m
	}
	tests := []struct {
		name string
		kvc  *kvv1.KVCluster
		pods map[int]Pod
		want string
	}{
		{"a plaintext cluster", kvcIn(kvv1.PhaseReady, 0), pods(plaintext, plaintext), "http"},
		{"a new TLS cluster before its pods", tlsCluster(), nil, "https"},
		{"a TLS cluster", tlsCluster(), pods(tlsOnly, tlsOnly), "https"},
		{"moving to TLS: a member still plaintext", tlsCluster(), pods(both, plaintext), "http"},
		{"moving to TLS: every member accepts both", tlsCluster(), pods(both, both), "https"},
		{"moving to TLS: plaintext dropped on some", tlsCluster(), pods(both, tlsOnly), "https"},
		{"flags unknown: the spec's", tlsCluster(), map[int]Pod{0: {}}, "https"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (Observation{Pods: tt.pods}).ClientScheme(tt.kvc); got != tt.want {
				t.Errorf("ClientScheme = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestTheSecondRollWaitsForTheFirst: peers move to TLS once every member has its peer certificate
// and is ready; once they started to, a member that is not ready does not take them back.
func TestTheSecondRollWaitsForTheFirst(t *testing.T) {
	unready := func(s *scenario) {
		p := s.obs.Pods[1]
		p.Ready = false
		s.obs.Pods[1] = p
	}
	moved := func(s *scenario) {
		p := s.obs.Pods[2]
		p.Transport = &both
		s.obs.Pods[2] = p
	}
	tests := []struct {
		name string
		s    *scenario
		want specs.Transport
	}{
		{"every member prepared and ready: peers move", formed(3, "3.7.3").listening(prepared), both},
		{"the last one prepared is not ready yet: wait", formed(3, "3.7.3").listening(prepared).with(unready), prepared},
		{"a member without its certificate: prepare", formed(3, "3.7.3").listening(prepared).with(func(s *scenario) {
			p := s.obs.Pods[0]
			p.Transport = &plaintext
			s.obs.Pods[0] = p
		}), prepared},
		{"peers moving: a member not ready does not take them back", formed(3, "3.7.3").listening(prepared).with(moved).with(unready), both},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.s.kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator, PlaintextClients: kvv1.PlaintextClientsAccept}
			if got := templateTransport(tt.s.kvc, tt.s.obs); got != tt.want {
				t.Errorf("template %s, want %s", got, tt.want)
			}
		})
	}
}

// TestPeerURLsFollowThePods: a member running with another peer scheme than etcd's membership
// has for it gets its URL changed, before anything else; unknown flags, terminating pods and
// members that never started are left alone.
func TestPeerURLsFollowThePods(t *testing.T) {
	tests := []struct {
		name   string
		s      *scenario
		want   Action
		member int
	}{
		{name: "in step", s: formed(3, "3.7.3").listening(plaintext), want: ActWait},
		{name: "restarted with TLS peers", s: formed(3, "3.7.3").listening(plaintext).with(func(s *scenario) {
			p := s.obs.Pods[1]
			p.Transport = &both
			s.obs.Pods[1] = p
		}), want: ActUpdatePeerURL, member: 1},
		{name: "before a pending restart", s: formed(3, "3.7.3").listening(plaintext).upgradeTo("3.7.4").with(func(s *scenario) {
			p := s.obs.Pods[2]
			p.Transport = &both
			s.obs.Pods[2] = p
		}), want: ActUpdatePeerURL, member: 2},
		{name: "flags unknown", s: formed(3, "3.7.3").with(func(s *scenario) { s.member(1).PeerURLs = []string{"https://elsewhere:2380"} }), want: ActWait},
		{name: "terminating", s: formed(3, "3.7.3").listening(plaintext).with(func(s *scenario) {
			p := s.obs.Pods[1]
			p.Transport, p.Terminating = &both, true
			s.obs.Pods[1] = p
		}), want: ActWait},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ro := planRollout(tt.s.kvc, tt.s.obs)
			if tt.want == ActWait && ro.Action == ActUpdatePeerURL || tt.want != ActWait && (ro.Action != tt.want || ro.Ordinal != tt.member) {
				t.Fatalf("got %v on kv-%d (%s), want %v on kv-%d", ro.Action, ro.Ordinal, ro.Message, tt.want, tt.member)
			}
			if ro.Action == ActUpdatePeerURL && ro.PeerURL != fmt.Sprintf("https://kv-%d.kv-peer.ns.svc:2380", tt.member) {
				t.Errorf("new peer URL %s", ro.PeerURL)
			}
		})
	}
}
