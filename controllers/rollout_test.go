package controllers

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
)

// scenario builds a formed cluster: n members kv-0..kv-(n-1) on version, kv-0 leading, every pod
// ready on the current template, every member caught up.
type scenario struct {
	kvc *kvv1.KVCluster
	obs observation
}

func formed(n int, version string) *scenario {
	kvc := kvcIn(kvv1.PhaseReady, 0)
	kvc.Spec.Partitions = int32(n)
	kvc.Spec.Version = version
	kvc.Status.CurrentVersion = version
	c := &members.Cluster{HasLeader: true}
	pods := map[int]podInfo{}
	for i := range n {
		name := fmt.Sprintf("kv-%d", i)
		c.Members = append(c.Members, members.Member{ID: uint64(i + 1), Name: name, Healthy: true, Leader: i == 0,
			Version: version, PeerURLs: []string{fmt.Sprintf("http://%s.kv-peer.ns.svc:2380", name)},
			RaftIndex: 500, AppliedIndex: 500})
		pods[i] = podInfo{uid: types.UID("pod-" + name), ready: true, volumeUID: types.UID("vol-" + name)}
		kvc.Status.Members = append(kvc.Status.Members, kvv1.MemberStatus{Name: name, VolumeUID: "vol-" + name})
	}
	return &scenario{kvc: kvc, obs: observation{cluster: c, pods: pods, stsSettled: true, readyMembers: int32(n)}}
}

func (s *scenario) member(i int) *members.Member { return &s.obs.cluster.Members[i] }

// upgradeTo changes spec.version: every pod becomes outdated.
func (s *scenario) upgradeTo(version string) *scenario {
	s.kvc.Spec.Version = version
	for i, p := range s.obs.pods {
		p.outdated = true
		s.obs.pods[i] = p
	}
	return s
}

// restarted marks member i as restarted on the new template and version.
func (s *scenario) restarted(i int) *scenario {
	p := s.obs.pods[i]
	p.outdated = false
	s.obs.pods[i] = p
	s.member(i).Version = s.kvc.Spec.Version
	return s
}

func (s *scenario) leader(i int) *scenario {
	for j := range s.obs.cluster.Members {
		s.member(j).Leader = j == i
	}
	return s
}

func (s *scenario) with(change func(s *scenario)) *scenario { change(s); return s }

func TestPlanRollout(t *testing.T) {
	const from, to = "3.6.16", "3.7.3"
	withBackup := func(s *scenario) {
		s.kvc.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backups"}}
	}
	tests := []struct {
		name        string
		s           *scenario
		wantPending bool
		wantAction  actionKind
		wantMember  string // the member acted on, or (for a wait) a word of the message
		wantTo      uint64
	}{
		{"a cluster matching its spec has nothing to do", formed(3, to), false, actWait, "", 0},
		{"a member that is down is not a rollout", formed(3, to).with(func(s *scenario) { s.member(1).Healthy = false }), false, actWait, "", 0},
		{"a cluster still forming is left to Creating", formed(3, to).with(func(s *scenario) { s.kvc.Status.CurrentVersion = "" }), false, actWait, "", 0},
		{"upgrade: followers first, highest ordinal first", formed(3, from).upgradeTo(to), true, actRestartPod, "kv-2", 0},
		{"upgrade: an unhealthy outdated member goes first", formed(3, from).upgradeTo(to).with(func(s *scenario) { s.member(1).Healthy = false }),
			true, actRestartPod, "kv-1", 0},
		{"upgrade: an unready outdated pod goes first", formed(3, from).upgradeTo(to).with(func(s *scenario) {
			p := s.obs.pods[1]
			p.ready = false
			s.obs.pods[1] = p
		}), true, actRestartPod, "kv-1", 0},
		{"upgrade: wait while a restarted member's pod is gone", formed(3, from).upgradeTo(to).with(func(s *scenario) { delete(s.obs.pods, 2) }),
			true, actWait, "come back", 0},
		{"upgrade: wait while a pod terminates (resume after an operator restart)", formed(3, from).upgradeTo(to).with(func(s *scenario) {
			p := s.obs.pods[2]
			p.terminating = true
			s.obs.pods[2] = p
			s.member(2).Healthy = false
		}), true, actWait, "come back", 0},
		{"upgrade: wait until the restarted member is healthy", formed(3, from).upgradeTo(to).restarted(2).with(func(s *scenario) { s.member(2).Healthy = false }),
			true, actWait, "healthy", 0},
		{"upgrade: wait until the restarted member caught up", formed(3, from).upgradeTo(to).restarted(2).with(func(s *scenario) {
			s.member(0).RaftIndex = 5000
			s.member(2).AppliedIndex = 100
		}), true, actWait, "catch up", 0},
		{"upgrade: next follower once the first is back and caught up", formed(3, from).upgradeTo(to).restarted(2), true, actRestartPod, "kv-1", 0},
		{"upgrade: the leader last, after moving leadership to the furthest updated member", formed(3, from).upgradeTo(to).restarted(2).restarted(1).with(func(s *scenario) {
			s.member(1).AppliedIndex = 510
			s.member(0).RaftIndex = 510
		}), true, actMoveLeader, "kv-0", 2},
		{"upgrade: the former leader restarts once it follows", formed(3, from).upgradeTo(to).restarted(2).restarted(1).leader(1), true, actRestartPod, "kv-0", 0},
		{"upgrade: never take a healthy member down while another is down", formed(3, from).upgradeTo(to).restarted(2).with(func(s *scenario) {
			s.member(2).Healthy = false
			p := s.obs.pods[2]
			p.ready = false
			s.obs.pods[2] = p
		}), true, actWait, "kv-2", 0},
		{"upgrade: a single member restarts (brief downtime is unavoidable)", formed(1, from).upgradeTo(to), true, actRestartPod, "kv-0", 0},
		{"upgrade: done when every member reports the version", formed(3, from).upgradeTo(to).restarted(0).restarted(1).restarted(2), false, actWait, "", 0},
		{"upgrade: wait for the StatefulSet controller to see the template", formed(3, from).with(func(s *scenario) {
			s.kvc.Spec.Version = to
			s.obs.stsSettled = false
		}), true, actWait, "StatefulSet", 0},
		{"pre-upgrade backup first", formed(3, from).upgradeTo(to).with(withBackup), true, actPreUpgradeBackup, "", 0},
		{"pre-upgrade backup running: wait", formed(3, from).upgradeTo(to).with(withBackup).with(func(s *scenario) { s.obs.preUpgradeBackup = jobRunning }),
			true, actWait, "pre-upgrade backup", 0},
		{"pre-upgrade backup failed: no member is touched", formed(3, from).upgradeTo(to).with(withBackup).with(func(s *scenario) { s.obs.preUpgradeBackup = jobFailed }),
			true, actWait, "failed", 0},
		{"pre-upgrade backup done: roll", formed(3, from).upgradeTo(to).with(withBackup).with(func(s *scenario) { s.obs.preUpgradeBackup = jobSucceeded }),
			true, actRestartPod, "kv-2", 0},
		{"scale up: add the next member as a learner", formed(3, to).with(func(s *scenario) { s.kvc.Spec.Partitions = 5 }), true, actAddLearner, "kv-3", 0},
		{"scale up: wait for the learner to start", formed(3, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.obs.cluster.Members = append(s.obs.cluster.Members, members.Member{ID: 9, Learner: true, PeerURLs: []string{"http://kv-3.kv-peer.ns.svc:2380"}})
		}), true, actWait, "learner", 0},
		{"scale up: promote the started learner", formed(4, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.member(3).Learner = true
		}), true, actPromote, "kv-3", 0},
		{"scale up: a learner that cannot start on its old volume is reset", formed(3, to).with(func(s *scenario) {
			s.obs.cluster.Members = append(s.obs.cluster.Members, members.Member{ID: 9, Learner: true, PeerURLs: []string{"http://kv-3.kv-peer.ns.svc:2380"}})
			s.kvc.Spec.Partitions = 4
			s.obs.pods[3] = podInfo{uid: "pod-kv-3", restarts: 2, volumeUID: "vol-old"}
		}), true, actWipeLearner, "kv-3", 0},
		{"scale up: no member is added while one is down", formed(3, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.member(2).Healthy = false
		}), true, actWait, "healthy", 0},
		{"scale down: remove the highest ordinal", formed(5, to).with(func(s *scenario) { s.kvc.Spec.Partitions = 3 }), true, actRemove, "kv-4", 0},
		{"scale down: move leadership off a member before removing it", formed(5, to).leader(4).with(func(s *scenario) { s.kvc.Spec.Partitions = 3 }),
			true, actMoveLeader, "kv-4", 1},
		{"scale down: a learner joining above the new size is removed", formed(4, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 3
			s.member(3).Learner = true
		}), true, actRemove, "kv-3", 0},
		{"lost data: a member back on a new volume is removed", formed(3, to).with(func(s *scenario) {
			s.member(1).Healthy = false
			s.obs.pods[1] = podInfo{uid: "pod-kv-1b", volumeUID: "vol-new", restarts: 3}
		}), true, actRemove, "kv-1", 0},
		{"lost data: its slot is filled by a new learner", formed(3, to).with(func(s *scenario) {
			s.obs.cluster.Members = append(s.obs.cluster.Members[:1], s.obs.cluster.Members[2])
			s.obs.pods[1] = podInfo{uid: "pod-kv-1b", volumeUID: "vol-new", restarts: 3}
		}), true, actAddLearner, "kv-1", 0},
		{"lost data: not removed when that would lose the quorum", formed(3, to).with(func(s *scenario) {
			s.member(1).Healthy = false
			s.member(2).Healthy = false
			s.obs.pods[1] = podInfo{uid: "pod-kv-1b", volumeUID: "vol-new"}
		}), true, actWait, "quorum", 0},
		{"no quorum: nothing is changed", formed(3, from).upgradeTo(to).with(func(s *scenario) { s.obs.cluster = nil }), true, actWait, "quorum", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planRollout(tt.s.kvc, tt.s.obs)
			if got.pending != tt.wantPending || got.action != tt.wantAction {
				t.Fatalf("planRollout = pending %t action %d (%s); want pending %t action %d", got.pending, got.action, got.message, tt.wantPending, tt.wantAction)
			}
			if got.action == actWait {
				if !strings.Contains(got.message, tt.wantMember) {
					t.Errorf("message %q does not mention %q", got.message, tt.wantMember)
				}
				return
			}
			if tt.wantMember != "" && fmt.Sprintf("kv-%d", got.ordinal) != tt.wantMember {
				t.Errorf("acts on kv-%d (%s), want %s", got.ordinal, got.message, tt.wantMember)
			}
			if got.to != tt.wantTo {
				t.Errorf("moves leadership to %d, want %d", got.to, tt.wantTo)
			}
		})
	}
}

func TestDesiredMembershipFollowsEtcd(t *testing.T) {
	s := formed(3, "3.7.3")
	s.obs.cluster.Members = append(s.obs.cluster.Members, members.Member{ID: 9, Learner: true, PeerURLs: []string{"http://kv-3.kv-peer.ns.svc:2380"}})
	m, replicas := desiredMembership(s.kvc, s.obs)
	if m.State != "existing" || fmt.Sprint(m.Ordinals) != "[0 1 2 3]" || replicas != 4 {
		t.Errorf("with a learner added: %+v replicas %d; want existing [0 1 2 3] and 4 pods", m, replicas)
	}
	// A removed member leaves a hole: the pods above it keep running.
	s.obs.cluster.Members = append(s.obs.cluster.Members[:1], s.obs.cluster.Members[2:]...)
	if m, replicas = desiredMembership(s.kvc, s.obs); fmt.Sprint(m.Ordinals) != "[0 2 3]" || replicas != 4 {
		t.Errorf("with kv-1 removed: %+v replicas %d", m, replicas)
	}
	// Without etcd's answer, what was written stays.
	s.obs.cluster = nil
	s.obs.membership = &m
	three := int32(4)
	s.obs.stsReplicas = &three
	if got, replicas := desiredMembership(s.kvc, s.obs); fmt.Sprint(got.Ordinals) != "[0 2 3]" || replicas != 4 {
		t.Errorf("without etcd: %+v replicas %d", got, replicas)
	}
	// A new cluster starts with every partition.
	s.kvc.Status.CurrentVersion = ""
	s.obs.membership = nil
	if got, replicas := desiredMembership(s.kvc, s.obs); got.State != "new" || len(got.Ordinals) != 3 || replicas != 3 {
		t.Errorf("new cluster: %+v replicas %d", got, replicas)
	}
}

func TestDisruptionBudgetFollowsVotingMembers(t *testing.T) {
	tests := []struct {
		name string
		s    *scenario
		want int32
	}{
		{"formed", formed(3, "3.7.3"), 3},
		{"scaling up: the learner does not count", formed(3, "3.7.3").with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.obs.cluster.Members = append(s.obs.cluster.Members, members.Member{ID: 9, Learner: true})
		}), 3},
		{"scaling down: never more than the spec", formed(5, "3.7.3").with(func(s *scenario) { s.kvc.Spec.Partitions = 3 }), 3},
		{"etcd not answering: the last known members", formed(3, "3.7.3").with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.obs.cluster = nil
		}), 3},
		{"nothing known yet: the spec", formed(3, "3.7.3").with(func(s *scenario) {
			s.obs.cluster = nil
			s.kvc.Status.Members = nil
		}), 3},
	}
	for _, tt := range tests {
		if got := disruptionBase(tt.s.kvc, tt.s.obs); got != tt.want {
			t.Errorf("%s: disruptionBase = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestUnknownMembersAreNeverActedOn: a member whose name and peer URL map to none of the
// cluster's pods (added by hand, or by something else) is reported and left alone; above all it
// is never taken for member 0, whose volume a learner reset would delete.
func TestUnknownMembersAreNeverActedOn(t *testing.T) {
	const to = "3.7.3"
	stranger := members.Member{ID: 77, Learner: true, PeerURLs: []string{"http://10.0.0.9:2380"}}
	tests := []struct {
		name string
		s    *scenario
	}{
		{name: "an unknown learner while member 0's pod crash-loops (one member)", s: formed(1, to).with(func(s *scenario) {
			s.obs.cluster.Members = append(s.obs.cluster.Members, stranger)
			s.obs.pods[0] = podInfo{uid: "pod-kv-0", restarts: 4, volumeUID: "vol-kv-0"}
		})},
		{name: "an unknown started learner", s: formed(3, to).with(func(s *scenario) {
			m := stranger
			m.Name, m.Healthy = "intruder", true
			s.obs.cluster.Members = append(s.obs.cluster.Members, m)
		})},
		{name: "an unknown voting member leads during an upgrade", s: formed(3, "3.6.16").upgradeTo(to).with(func(s *scenario) {
			m := stranger
			m.Name, m.Learner, m.Healthy = "intruder", false, true
			s.obs.cluster.Members = append(s.obs.cluster.Members, m)
			s.leader(3)
		})},
		{name: "a member named like one of ours, at another address", s: formed(3, to).with(func(s *scenario) {
			m := stranger
			m.Name, m.Learner, m.Healthy = "kv-3", true, true
			s.obs.cluster.Members = append(s.obs.cluster.Members, m)
			s.kvc.Spec.Partitions = 4
		})},
		{name: "two members claim one pod", s: formed(3, to).with(func(s *scenario) {
			m := *s.member(1)
			m.ID = 0x4d
			s.obs.cluster.Members = append(s.obs.cluster.Members, m)
		})},
		{name: "an unknown member while scaling down", s: formed(3, to).with(func(s *scenario) {
			m := stranger
			m.Name, m.Learner, m.Healthy = "intruder", false, true
			s.obs.cluster.Members = append(s.obs.cluster.Members, m)
			s.kvc.Spec.Partitions = 1
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planRollout(tt.s.kvc, tt.s.obs)
			if got.action != actWait || !got.pending || got.reason != ReasonUnknownMember {
				t.Fatalf("planRollout = action %d reason %q (%s); want to wait with reason %s", got.action, got.reason, got.message, ReasonUnknownMember)
			}
			if !strings.Contains(got.message, "4d") || !strings.Contains(got.message, "member remove") {
				t.Errorf("message %q must name the member (ID 4d) and how to remove it", got.message)
			}
		})
	}
}

// TestUpgradeLastsUntilEveryMemberRunsTheTarget: while the last restarted member comes back, the
// cluster is still upgrading; it is Ready only once every member answers on the new version.
func TestUpgradeLastsUntilEveryMemberRunsTheTarget(t *testing.T) {
	const from, to = "3.6.16", "3.7.3"
	lastRestarting := formed(3, from).upgradeTo(to).restarted(2).restarted(1).leader(1).restarted(0).with(func(s *scenario) {
		s.kvc.Status.Phase = kvv1.PhaseUpgrading
		s.member(0).Healthy, s.member(0).Version = false, ""
		p := s.obs.pods[0]
		p.ready = false
		s.obs.pods[0] = p
		s.obs.readyMembers = 2
	})
	got := planRollout(lastRestarting.kvc, lastRestarting.obs)
	if !got.pending || got.action != actWait || !strings.Contains(got.message, "kv-0") {
		t.Fatalf("planRollout = pending %t action %d (%s); want to wait for kv-0", got.pending, got.action, got.message)
	}
	lastRestarting.obs.rollout = got
	st, v := decide(lastRestarting.kvc, lastRestarting.obs, "", t0)
	if v.phase != kvv1.PhaseUpgrading || st.CurrentVersion != from {
		t.Errorf("while the last member restarts: phase %s, currentVersion %s; want Upgrading on %s", v.phase, st.CurrentVersion, from)
	}

	done := formed(3, from).upgradeTo(to).restarted(2).restarted(1).restarted(0).with(func(s *scenario) { s.kvc.Status.Phase = kvv1.PhaseUpgrading })
	done.obs.rollout = planRollout(done.kvc, done.obs)
	st, v = decide(done.kvc, done.obs, "", t0)
	if v.phase != kvv1.PhaseReady || st.CurrentVersion != to {
		t.Errorf("once every member runs %s: phase %s, currentVersion %s; want Ready on %s", to, v.phase, st.CurrentVersion, to)
	}

	// A member that goes down after the upgrade finished is the Ready condition's business.
	after := formed(3, to).with(func(s *scenario) { s.member(1).Healthy = false })
	if got := planRollout(after.kvc, after.obs); got.pending {
		t.Errorf("a member down after the upgrade is not a rollout: %s", got.message)
	}
}
