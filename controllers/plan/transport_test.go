package plan

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

var (
	plaintext = specs.Transport{ClientPlain: true}
	preparing = specs.Transport{PeerCerts: true, ClientTLS: true, ClientPlain: true}
	both      = specs.Transport{PeerTLS: true, PeerCerts: true, ClientTLS: true, ClientPlain: true}
	tlsOnly   = specs.Transport{PeerTLS: true, PeerCerts: true, ClientTLS: true}
)

// listening gives every pod of the scenario, and the StatefulSet's template, the transport t.
func (s *scenario) listening(t specs.Transport) *scenario {
	for i, p := range s.obs.Pods {
		p.Transport = &t
		s.obs.Pods[i] = p
	}
	replicas := int32(len(s.obs.Pods))
	s.obs.STSTransport, s.obs.STSReplicas = &t, &replicas
	return s
}

// movingToTLS is a formed plaintext cluster whose spec now asks for TLS.
func movingToTLS(clients kvv1.PlaintextClients) *scenario {
	s := formed(3, "3.7.3").listening(plaintext)
	s.kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator, PlaintextClients: clients}
	return s
}

// movingToPlaintext is a formed TLS cluster (listening as t) whose spec now asks for plaintext.
func movingToPlaintext(t specs.Transport) *scenario {
	s := formed(3, "3.7.3").listening(t)
	for ord := range 3 {
		s.member(ord).PeerURLs = []string{fmt.Sprintf("https://kv-%d.kv-peer.ns.svc:2380", ord)}
	}
	s.kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSDisabled}
	return s
}

func (s *scenario) pod(ord int, change func(p *Pod)) *scenario {
	p := s.obs.Pods[ord]
	change(&p)
	s.obs.Pods[ord] = p
	return s
}

// TestMovingToTLSAndBack plays a running cluster's move to TLS, or back, step by step, acting as the
// operator, the StatefulSet controller and the kubelet would: the template is applied; a deleted
// pod terminates, is gone, comes back on the template of the moment not ready, then ready; a peer
// URL change is applied; leadership moves. At every step it checks what a user relies on:
//   - every member, and the template pods come back on, accepts the scheme clients are told to use
//     (status.clientEndpoint, the operator's own client, backup Jobs);
//   - no member restarts while another is dialled at a scheme it does not listen for (two such
//     members could not reach each other, and a third restart would lose the quorum);
//   - no member listens for peers on https while another has no peer certificate (as leader,
//     that one could not send it a snapshot);
//   - the template never goes back (a member would restart again and again).
func TestMovingToTLSAndBack(t *testing.T) {
	tests := []struct {
		name       string
		s          *scenario
		wantRolls  []specs.Transport
		wantScheme string
	}{
		{name: "to TLS, clients refused in plaintext: certificates and both client schemes first, then TLS only",
			s: movingToTLS(""), wantRolls: []specs.Transport{preparing, tlsOnly}, wantScheme: "https"},
		{name: "to TLS, plaintext clients accepted: certificates first, then peers on TLS",
			s: movingToTLS(kvv1.PlaintextClientsAccept), wantRolls: []specs.Transport{preparing, both}, wantScheme: "https"},
		{name: "back from TLS only: peers on plaintext and both client schemes first, then no certificates",
			s: movingToPlaintext(tlsOnly), wantRolls: []specs.Transport{preparing, plaintext}, wantScheme: "http"},
		{name: "back from TLS with plaintext clients accepted: peers on plaintext first, then no certificates",
			s: movingToPlaintext(both), wantRolls: []specs.Transport{preparing, plaintext}, wantScheme: "http"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.s
			var rolls, steps []string
			restarting := map[int]int{} // ordinal → passes since its deletion
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("after %s: %s", strings.Join(steps, "; "), fmt.Sprintf(format, args...))
			}
			for pass := 0; ; pass++ {
				if pass > 100 {
					fail("no end after 100 passes")
				}
				for ord, n := range restarting { // the pod's life after its deletion, one stage a pass
					restarting[ord] = n + 1
					switch n {
					case 0: // terminating: seen as such once
					case 1:
						delete(s.obs.Pods, ord)
					case 2:
						tr := *s.obs.STSTransport
						s.obs.Pods[ord] = Pod{Transport: &tr, Ready: false}
					default:
						s.pod(ord, func(p *Pod) { p.Ready = true })
						s.member(ord).Healthy = true
						delete(restarting, ord)
					}
				}
				if now := templateTransport(s.kvc, s.obs); now != *s.obs.STSTransport {
					if len(rolls) > 0 && slices.Contains(rolls, now.String()) {
						fail("the template goes back to %s", now)
					}
					rolls = append(rolls, now.String())
					s.obs.STSTransport = &now
					for ord, p := range s.obs.Pods {
						s.pod(ord, func(q *Pod) { q.Outdated = *p.Transport != now })
					}
				}
				scheme := s.obs.ClientScheme(s.kvc)
				for ord, p := range s.obs.Pods {
					if accepts := map[string]bool{"https": p.Transport.ClientTLS, "http": p.Transport.ClientPlain}[scheme]; !accepts {
						fail("clients are told to use %s, which member %d (%s) refuses", scheme, ord, p.Transport)
					}
					for other, q := range s.obs.Pods {
						if p.Transport.PeerTLS && !q.Transport.PeerCerts {
							fail("member %d listens for peers on https, member %d has no peer certificate to reach it", ord, other)
						}
					}
				}
				ro := planRollout(s.kvc, s.obs)
				if !ro.Pending && len(restarting) == 0 {
					break
				}
				name := fmt.Sprintf("kv-%d", ro.Ordinal)
				switch ro.Action {
				case ActWait:
				case ActRestartPod:
					for ord, p := range s.obs.Pods {
						if want := p.Transport.MemberPeerURL(s.kvc, ord); !p.Terminating && !slices.Equal(s.member(ord).PeerURLs, []string{want}) {
							fail("%s restarts while member %d is dialled at %v but listens at %s", name, ord, s.member(ord).PeerURLs, want)
						}
					}
					s.pod(ro.Ordinal, func(p *Pod) { p.Terminating, p.Ready = true, false })
					s.member(ro.Ordinal).Healthy = false
					restarting[ro.Ordinal] = 0
					steps = append(steps, "restart "+name)
				case ActUpdatePeerURL:
					s.member(ro.Ordinal).PeerURLs = []string{ro.PeerURL}
					steps = append(steps, "update "+name)
				case ActMoveLeader:
					s.leader(int(ro.To - 1))
					steps = append(steps, fmt.Sprintf("move leader to kv-%d", ro.To-1))
				default:
					fail("unexpected step %v: %s", ro.Action, ro.Message)
				}
			}
			t.Logf("steps: %s", strings.Join(steps, "; "))
			want := []string{}
			for _, r := range tt.wantRolls {
				want = append(want, r.String())
			}
			if !slices.Equal(rolls, want) {
				t.Errorf("templates %v, want %v", rolls, want)
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

// TestTemplateTransport: peers move to TLS once every member has its peer certificate and is
// ready; once the template moved them, nothing takes them back.
func TestTemplateTransport(t *testing.T) {
	tests := []struct {
		name string
		s    *scenario
		want specs.Transport
	}{
		{"a plaintext cluster stays so", formed(3, "3.7.3").listening(plaintext), plaintext},
		{"a TLS cluster stays so", formed(3, "3.7.3").listening(tlsOnly).with(func(s *scenario) { s.kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator} }), tlsOnly},
		{"a new TLS cluster is made so", formed(3, "3.7.3").with(func(s *scenario) {
			s.kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
			s.obs.Pods = nil
		}), tlsOnly},
		{"moving: certificates and both client schemes first", movingToTLS(""), preparing},
		{"every member prepared and ready: peers move", movingToTLS("").listening(preparing), tlsOnly},
		{"the last one prepared is not ready yet: wait", movingToTLS("").listening(preparing).pod(1, func(p *Pod) { p.Ready = false }), preparing},
		{"one is gone: wait", movingToTLS("").listening(preparing).with(func(s *scenario) { delete(s.obs.Pods, 2) }), preparing},
		{"one still runs plaintext: wait", movingToTLS("").listening(preparing).pod(0, func(p *Pod) { p.Transport = &plaintext }), preparing},
		{"peers moved in the template: a member not ready, or gone, does not take them back", movingToTLS("").listening(preparing).
			with(func(s *scenario) {
				s.obs.STSTransport = &tlsOnly
				delete(s.obs.Pods, 2)
			}).pod(1, func(p *Pod) { p.Ready = false }), tlsOnly},
		{"moving back: peers on plaintext first, certificates kept", movingToPlaintext(tlsOnly), preparing},
		{"moving back, every member prepared and ready: certificates go", movingToPlaintext(tlsOnly).listening(preparing), plaintext},
		{"moving back, one not ready: wait", movingToPlaintext(tlsOnly).listening(preparing).pod(2, func(p *Pod) { p.Ready = false }), preparing},
		{"moving back, one still on TLS peers: wait", movingToPlaintext(tlsOnly).listening(preparing).pod(0, func(p *Pod) { p.Transport = &tlsOnly }), preparing},
		{"back to plaintext half-way to TLS: the step done, certificates go", movingToTLS("").listening(preparing).with(func(s *scenario) {
			s.kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSDisabled}
		}), plaintext},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := templateTransport(tt.s.kvc, tt.s.obs); got != tt.want {
				t.Errorf("template %s, want %s", got, tt.want)
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
	obs := func(template *specs.Transport, ts ...specs.Transport) Observation {
		m := map[int]Pod{}
		for i, t := range ts {
			m[i] = Pod{Transport: &t}
		}
		return Observation{STSTransport: template, Pods: m}
	}
	tests := []struct {
		name string
		kvc  *kvv1.KVCluster
		obs  Observation
		want string
	}{
		{"a plaintext cluster", kvcIn(kvv1.PhaseReady, 0), obs(&plaintext, plaintext, plaintext), "http"},
		{"a new TLS cluster before its StatefulSet", tlsCluster(), obs(nil), "https"},
		{"a TLS cluster", tlsCluster(), obs(&tlsOnly, tlsOnly, tlsOnly), "https"},
		{"moving to TLS: the template not applied yet", tlsCluster(), obs(&plaintext, plaintext, plaintext), "http"},
		{"moving to TLS: a member still plaintext", tlsCluster(), obs(&preparing, preparing, plaintext), "http"},
		{"moving to TLS: every member accepts both", tlsCluster(), obs(&preparing, preparing, preparing), "https"},
		{"moving to TLS: plaintext dropped on some", tlsCluster(), obs(&tlsOnly, preparing, tlsOnly), "https"},
		{"moving to TLS: pods gone come back on a template accepting both", tlsCluster(), obs(&preparing), "https"},
		{"moving back: the members refuse plaintext yet", kvcIn(kvv1.PhaseReady, 0), obs(&preparing, tlsOnly, tlsOnly), "https"},
		{"moving back: a member accepts both", kvcIn(kvv1.PhaseReady, 0), obs(&preparing, preparing, tlsOnly), "https"},
		{"moving back: every member accepts both", kvcIn(kvv1.PhaseReady, 0), obs(&preparing, preparing, preparing), "http"},
		{"moving back: the certificates gone on some", kvcIn(kvv1.PhaseReady, 0), obs(&plaintext, preparing, plaintext), "http"},
		{"a pod whose flags are unknown decides nothing", tlsCluster(), Observation{STSTransport: &preparing, Pods: map[int]Pod{0: {}, 1: {Transport: &plaintext}}}, "http"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.obs.ClientScheme(tt.kvc); got != tt.want {
				t.Errorf("ClientScheme = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestPeerURLsFollowThePods: a member running with another peer scheme than etcd's membership
// has for it gets its URL changed, before anything else; unknown flags and terminating pods are
// left alone; a learner that has not started is changed too.
func TestPeerURLsFollowThePods(t *testing.T) {
	tests := []struct {
		name   string
		s      *scenario
		want   Action
		member int
	}{
		{name: "in step", s: formed(3, "3.7.3").listening(plaintext), want: ActWait},
		{name: "restarted with TLS peers", s: formed(3, "3.7.3").listening(plaintext).pod(1, func(p *Pod) { p.Transport = &both }),
			want: ActUpdatePeerURL, member: 1},
		{name: "before a pending restart", s: formed(3, "3.7.3").listening(plaintext).upgradeTo("3.7.4").pod(2, func(p *Pod) { p.Transport = &both }),
			want: ActUpdatePeerURL, member: 2},
		{name: "flags unknown", s: formed(3, "3.7.3").with(func(s *scenario) { s.member(1).PeerURLs = []string{"https://kv-1.kv-peer.ns.svc:2380"} }), want: ActWait},
		{name: "terminating", s: formed(3, "3.7.3").listening(plaintext).pod(1, func(p *Pod) { p.Transport, p.Terminating = &both, true }), want: ActWait},
		{name: "a learner added just before the template changed", s: formed(3, "3.7.3").listening(plaintext).with(func(s *scenario) {
			s.member(2).Name, s.member(2).Learner = "", true
		}).pod(2, func(p *Pod) { p.Transport = &both }), want: ActUpdatePeerURL, member: 2},
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

// TestJoiningDuringTheMove: a member added while the cluster moves to TLS is added at the peer URL
// its pod will listen at (the template's), and a member joining is told the peer URLs etcd has,
// whichever scheme each is on.
func TestJoiningDuringTheMove(t *testing.T) {
	s := movingToTLS("").with(func(s *scenario) { s.kvc.Spec.Partitions = 4 })
	ro := planRollout(s.kvc, s.obs)
	if ro.Action != ActAddLearner || ro.PeerURL != "http://kv-3.kv-peer.ns.svc:2380" {
		t.Errorf("got %v at %q, want the learner added at its plaintext peer URL", ro.Action, ro.PeerURL)
	}
	s.member(1).PeerURLs = []string{"https://kv-1.kv-peer.ns.svc:2380"}
	m, _ := desiredMembership(s.kvc, s.obs)
	got := specs.MembershipConfigMap(s.kvc, m, "").Data["initial-cluster"]
	want := "kv-0=http://kv-0.kv-peer.ns.svc:2380,kv-1=https://kv-1.kv-peer.ns.svc:2380,kv-2=http://kv-2.kv-peer.ns.svc:2380"
	if got != want {
		t.Errorf("initial cluster %s, want %s", got, want)
	}
	if back, ok := specs.ParseMembership(s.kvc, map[string]string{"initial-cluster": got, "initial-cluster-state": "existing"}); !ok || back.PeerURLs[0] != "http://kv-0.kv-peer.ns.svc:2380" {
		t.Errorf("read back %+v, %t", back, ok)
	}
}

// TestTheSchemeReachesEveryClient: status.clientEndpoint, the rollout's member endpoint and a
// scheduled backup Job use the scheme every member accepts, not the spec's.
func TestTheSchemeReachesEveryClient(t *testing.T) {
	s := movingToTLS("").pod(0, func(p *Pod) { p.Transport = &preparing }).pod(1, func(p *Pod) { p.Outdated = true })
	s.kvc.Spec.BackupSchedule = "* * * * *"
	s.kvc.Spec.Backup = &kvv1.BackupSpec{JobHistoryLimit: 2, S3: &kvv1.S3Destination{Endpoint: "s3:7070", Bucket: "b", CredentialsSecret: "s"}}
	s.kvc.CreationTimestamp.Time = t0.Add(-time.Hour)
	s.obs.TLS = issuedTLS(t, s.kvc, t0.Add(-time.Hour))
	p := Make(s.kvc, s.obs, t0, Config{Images: specs.Images{Operator: "operator:dev"}})
	if p.Status.ClientEndpoint != "http://kv-client.ns.svc:2379" || p.Rollout.Action != ActRestartPod || !strings.HasPrefix(p.Rollout.Endpoint, "http://") {
		t.Errorf("endpoint %s, rollout's %s (%s: %s); want http while a member accepts nothing else", p.Status.ClientEndpoint, p.Rollout.Endpoint, p.Reason, p.Message)
	}
	if p.Backups.Start == nil {
		t.Fatal("no backup started")
	}
	args := strings.Join(p.Backups.Start.Spec.Template.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--endpoints=http://kv-0.") || strings.Contains(args, "--cacert") {
		t.Errorf("backup reaches the members so: %s", args)
	}
}
