package plan

import (
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/members/memberstest"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// scenario builds a formed cluster: n members kv-0..kv-(n-1) on version, kv-0 leading, every pod
// running and ready on the current template, every member caught up.
type scenario struct {
	kvc *kvv1.KVCluster
	obs Observation
}

func formed(n int, version string) *scenario {
	kvc := kvcIn(kvv1.PhaseReady, 0)
	kvc.Spec.Partitions = int32(n)
	kvc.Spec.Version = version
	kvc.Status.CurrentVersion = version
	c := memberstest.Healthy(kvc, n, version)
	pods := map[int]Pod{}
	for i := range n {
		name := fmt.Sprintf("kv-%d", i)
		pods[i] = Pod{UID: types.UID("pod-" + name), Ready: true, Running: true, VolumeUID: types.UID("vol-" + name)}
		kvc.Status.Members = append(kvc.Status.Members, kvv1.MemberStatus{Name: name, ID: fmt.Sprintf("%x", c.Members[i].ID), VolumeUID: "vol-" + name})
	}
	return &scenario{kvc: kvc, obs: Observation{Cluster: &c, Pods: pods, STSSettled: true, ReadyMembers: int32(n)}}
}

// preUpgradeJob is the pre-upgrade backup Job for version, finished as condition says ("" while it runs).
func preUpgradeJob(version string, condition batchv1.JobConditionType) *batchv1.Job {
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "kv-preupgrade", Namespace: "ns", UID: "job-uid",
		Annotations: map[string]string{specs.TargetVersionAnnotation: version}}}
	if condition != "" {
		job.Status.Conditions = []batchv1.JobCondition{{Type: condition, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0)}}
	}
	return job
}

func (s *scenario) member(i int) *members.Member { return &s.obs.Cluster.Members[i] }

// upgradeTo changes spec.version: every pod becomes outdated.
func (s *scenario) upgradeTo(version string) *scenario {
	s.kvc.Spec.Version = version
	for i, p := range s.obs.Pods {
		p.Outdated = true
		s.obs.Pods[i] = p
	}
	return s
}

// restarted marks member i as restarted on the new template and version.
func (s *scenario) restarted(i int) *scenario {
	p := s.obs.Pods[i]
	p.Outdated = false
	s.obs.Pods[i] = p
	s.member(i).Version = s.kvc.Spec.Version
	return s
}

func (s *scenario) leader(i int) *scenario {
	for j := range s.obs.Cluster.Members {
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
		wantAction  Action
		wantMember  string // the member acted on, or (for a wait) a word of the message
		wantTo      uint64
		wantReason  string // when set
		// wantAwaitsEvent: a wait that a change the operator watches ends (a member pod's, the
		// StatefulSet's), so it is not polled every 5 s; every other wait is.
		wantAwaitsEvent bool
		check           func(t *testing.T, got Rollout)
	}{
		{name: "a cluster matching its spec has nothing to do", s: formed(3, to), wantPending: false, wantAction: ActWait, wantMember: "", wantTo: 0},
		{name: "a member that is down is not a rollout", s: formed(3, to).with(func(s *scenario) { s.member(1).Healthy = false }), wantPending: false, wantAction: ActWait, wantMember: "", wantTo: 0},
		{name: "a cluster still forming is left to Creating", s: formed(3, to).with(func(s *scenario) { s.kvc.Status.CurrentVersion = "" }), wantPending: false, wantAction: ActWait, wantMember: "", wantTo: 0},
		{name: "upgrade: followers first, highest ordinal first", s: formed(3, from).upgradeTo(to), wantPending: true, wantAction: ActRestartPod, wantMember: "kv-2", wantTo: 0},
		{name: "upgrade: an unhealthy outdated member goes first", s: formed(3, from).upgradeTo(to).with(func(s *scenario) { s.member(1).Healthy = false }),
			wantPending: true, wantAction: ActRestartPod, wantMember: "kv-1", wantTo: 0},
		{name: "upgrade: an unready outdated pod goes first", s: formed(3, from).upgradeTo(to).with(func(s *scenario) {
			p := s.obs.Pods[1]
			p.Ready = false
			s.obs.Pods[1] = p
		}), wantPending: true, wantAction: ActRestartPod, wantMember: "kv-1", wantTo: 0},
		{name: "a template whose pods could not be created restarts no member, not even an unhealthy one", s: formed(3, from).upgradeTo(to).with(func(s *scenario) {
			s.member(1).Healthy = false
			s.obs.MissingPodReferences = []string{"ServiceAccount etcd-backups"}
		}), wantPending: true, wantAction: ActWait, wantMember: "spec.pods names ServiceAccount etcd-backups, which does not exist", wantTo: 0, wantReason: ReasonPodsNotCreatable},
		{name: "upgrade: wait while a restarted member's pod is gone", s: formed(3, from).upgradeTo(to).with(func(s *scenario) { delete(s.obs.Pods, 2) }),
			wantPending: true, wantAction: ActWait, wantAwaitsEvent: true, wantMember: "come back", wantTo: 0},
		{name: "upgrade: wait while a pod terminates (resume after an operator restart)", s: formed(3, from).upgradeTo(to).with(func(s *scenario) {
			p := s.obs.Pods[2]
			p.Terminating = true
			s.obs.Pods[2] = p
			s.member(2).Healthy = false
		}), wantPending: true, wantAction: ActWait, wantAwaitsEvent: true, wantMember: "come back", wantTo: 0},
		{name: "upgrade: wait until the restarted member is healthy", s: formed(3, from).upgradeTo(to).restarted(2).with(func(s *scenario) { s.member(2).Healthy = false }),
			wantPending: true, wantAction: ActWait, wantMember: "healthy", wantTo: 0},
		{name: "upgrade: wait until the restarted member caught up", s: formed(3, from).upgradeTo(to).restarted(2).with(func(s *scenario) {
			s.member(0).RaftIndex = 5000
			s.member(2).AppliedIndex = 100
		}), wantPending: true, wantAction: ActWait, wantMember: "catch up", wantTo: 0},
		{name: "upgrade: next follower once the first is back and caught up", s: formed(3, from).upgradeTo(to).restarted(2), wantPending: true, wantAction: ActRestartPod, wantMember: "kv-1", wantTo: 0},
		{name: "upgrade: the leader last, after moving leadership to the furthest updated member", s: formed(3, from).upgradeTo(to).restarted(2).restarted(1).with(func(s *scenario) {
			s.member(1).AppliedIndex = 510
			s.member(0).RaftIndex = 510
		}), wantPending: true, wantAction: ActMoveLeader, wantMember: "kv-0", wantTo: 2},
		{name: "upgrade: the former leader restarts once it follows", s: formed(3, from).upgradeTo(to).restarted(2).restarted(1).leader(1), wantPending: true, wantAction: ActRestartPod, wantMember: "kv-0", wantTo: 0},
		{name: "upgrade: never take a healthy member down while another is down", s: formed(3, from).upgradeTo(to).restarted(2).with(func(s *scenario) {
			s.member(2).Healthy = false
			p := s.obs.Pods[2]
			p.Ready = false
			s.obs.Pods[2] = p
		}), wantPending: true, wantAction: ActWait, wantAwaitsEvent: true, wantMember: "kv-2", wantTo: 0},
		{name: "upgrade: a single member restarts (brief downtime is unavoidable)", s: formed(1, from).upgradeTo(to), wantPending: true, wantAction: ActRestartPod, wantMember: "kv-0", wantTo: 0},
		{name: "upgrade: done when every member reports the version", s: formed(3, from).upgradeTo(to).restarted(0).restarted(1).restarted(2), wantPending: false, wantAction: ActWait, wantMember: "", wantTo: 0},
		{name: "upgrade: every pod restarted, wait for one not Ready yet", s: formed(3, from).upgradeTo(to).restarted(0).restarted(1).restarted(2).with(func(s *scenario) {
			s.kvc.Status.Phase = kvv1.PhaseUpgrading
			p := s.obs.Pods[0]
			p.Ready = false
			s.obs.Pods[0] = p
		}), wantPending: true, wantAction: ActWait, wantAwaitsEvent: true, wantMember: "kv-0 to be healthy on 3.7.3", wantTo: 0},
		{name: "upgrade: every pod restarted and Ready, wait for etcd to call one healthy", s: formed(3, from).upgradeTo(to).restarted(0).restarted(1).restarted(2).with(func(s *scenario) {
			s.kvc.Status.Phase = kvv1.PhaseUpgrading
			s.member(0).Healthy = false
		}), wantPending: true, wantAction: ActWait, wantMember: "kv-0 to be healthy on 3.7.3", wantTo: 0},
		{name: "upgrade: wait for the StatefulSet controller to see the template", s: formed(3, from).with(func(s *scenario) {
			s.kvc.Spec.Version = to
			s.obs.STSSettled = false
		}), wantPending: true, wantAction: ActWait, wantAwaitsEvent: true, wantMember: "StatefulSet", wantTo: 0},
		{name: "pre-upgrade backup first", s: formed(3, from).upgradeTo(to).with(withBackup), wantPending: true, wantAction: ActPreUpgradeBackup, wantMember: "", wantTo: 0},
		{name: "pre-upgrade backup: an earlier upgrade's Job makes room first", s: formed(3, from).upgradeTo(to).with(withBackup).with(func(s *scenario) {
			s.obs.PreUpgradeJob = preUpgradeJob(from, batchv1.JobComplete)
		}), wantPending: true, wantAction: ActPreUpgradeBackup, wantMember: "", wantTo: 0,
			check: func(t *testing.T, got Rollout) {
				if got.OldJob == nil || got.OldJob.Annotations[specs.TargetVersionAnnotation] != from {
					t.Errorf("old Job to delete = %v, want the upgrade to %s's", got.OldJob, from)
				}
			}},
		{name: "pre-upgrade backup waits for a scheduled backup running: never two at once", s: formed(3, from).upgradeTo(to).with(withBackup).with(func(s *scenario) {
			s.obs.Jobs = []Job{backupJobAt("kv-29934000", "", time.Time{})}
		}), wantPending: true, wantAction: ActWait, wantMember: "kv-29934000", wantTo: 0},
		{name: "pre-upgrade backup running: wait", s: formed(3, from).upgradeTo(to).with(withBackup).with(func(s *scenario) { s.obs.PreUpgradeJob = preUpgradeJob(to, "") }),
			wantPending: true, wantAction: ActWait, wantMember: "pre-upgrade backup", wantTo: 0},
		{name: "pre-upgrade backup failed: no member is touched", s: formed(3, from).upgradeTo(to).with(withBackup).with(func(s *scenario) { s.obs.PreUpgradeJob = preUpgradeJob(to, batchv1.JobFailed) }),
			wantPending: true, wantAction: ActWait, wantMember: "failed", wantTo: 0},
		{name: "pre-upgrade backup done: roll", s: formed(3, from).upgradeTo(to).with(withBackup).with(func(s *scenario) { s.obs.PreUpgradeJob = preUpgradeJob(to, batchv1.JobComplete) }),
			wantPending: true, wantAction: ActRestartPod, wantMember: "kv-2", wantTo: 0},
		{name: "scale up: add the next member as a learner", s: formed(3, to).with(func(s *scenario) { s.kvc.Spec.Partitions = 5 }), wantPending: true, wantAction: ActAddLearner, wantMember: "kv-3", wantTo: 0},
		{name: "scale up: wait for the learner to start", s: formed(3, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, members.Member{ID: 9, Learner: true, PeerURLs: []string{"http://kv-3.kv-peer.ns.svc:2380"}})
		}), wantPending: true, wantAction: ActWait, wantAwaitsEvent: true, wantMember: "learner", wantTo: 0},
		{name: "scale up: no member is added whose pod could not be created", s: formed(3, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.obs.MissingPodReferences = []string{"PriorityClass etcd-critical"}
		}), wantPending: true, wantAction: ActWait, wantMember: "spec.pods names PriorityClass etcd-critical", wantTo: 0, wantReason: ReasonPodsNotCreatable},
		{name: "scale up: a learner whose pod could not be created says why", s: formed(3, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, members.Member{ID: 9, Learner: true, PeerURLs: []string{"http://kv-3.kv-peer.ns.svc:2380"}})
			s.obs.MissingPodReferences = []string{"ServiceAccount etcd"}
		}), wantPending: true, wantAction: ActWait, wantMember: "kv-3 is joining as a learner, but its pod cannot be created: spec.pods names ServiceAccount etcd", wantTo: 0, wantReason: ReasonPodsNotCreatable},
		{name: "scale up: promote the started learner", s: formed(4, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.member(3).Learner = true
		}), wantPending: true, wantAction: ActPromote, wantMember: "kv-3", wantTo: 0},
		{name: "scale up: a learner that cannot start on its old volume is reset", s: formed(3, to).with(func(s *scenario) {
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, members.Member{ID: 9, Learner: true, PeerURLs: []string{"http://kv-3.kv-peer.ns.svc:2380"}})
			s.kvc.Spec.Partitions = 4
			s.obs.Pods[3] = Pod{UID: "pod-kv-3", Restarts: 2, VolumeUID: "vol-old"}
		}), wantPending: true, wantAction: ActWipeLearner, wantMember: "kv-3", wantTo: 0},
		{name: "scale up: a new learner whose first start failed gets another one", s: formed(3, to).with(func(s *scenario) {
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, members.Member{ID: 9, Learner: true, PeerURLs: []string{"http://kv-3.kv-peer.ns.svc:2380"}})
			s.kvc.Spec.Partitions = 4
			s.obs.Pods[3] = Pod{UID: "pod-kv-3", Restarts: 1, VolumeUID: "vol-new"}
		}), wantPending: true, wantAction: ActWait, wantAwaitsEvent: true, wantMember: "learner", wantTo: 0},
		{name: "scale up: a learner whose etcd is running again is not reset", s: formed(3, to).with(func(s *scenario) {
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, members.Member{ID: 9, Learner: true, PeerURLs: []string{"http://kv-3.kv-peer.ns.svc:2380"}})
			s.kvc.Spec.Partitions = 4
			s.obs.Pods[3] = Pod{UID: "pod-kv-3", Restarts: 2, Running: true, VolumeUID: "vol-old"}
		}), wantPending: true, wantAction: ActWait, wantMember: "learner", wantTo: 0},
		{name: "scale up: no member is added while one is down", s: formed(3, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.member(2).Healthy = false
		}), wantPending: true, wantAction: ActWait, wantMember: "healthy", wantTo: 0},
		{name: "scale down: remove the highest ordinal, keeping its volume", s: formed(5, to).with(func(s *scenario) { s.kvc.Spec.Partitions = 3 }), wantPending: true, wantAction: ActRemove, wantMember: "kv-4", wantTo: 0,
			check: func(t *testing.T, got Rollout) {
				if got.VolumeUID != "" || got.PodUID != "" {
					t.Errorf("a scale-down resets pod %q and claim %q, want none", got.PodUID, got.VolumeUID)
				}
			}},
		{name: "scale down: move leadership off a member before removing it", s: formed(5, to).leader(4).with(func(s *scenario) { s.kvc.Spec.Partitions = 3 }),
			wantPending: true, wantAction: ActMoveLeader, wantMember: "kv-4", wantTo: 1},
		{name: "scale down: a learner joining above the new size is removed", s: formed(4, to).with(func(s *scenario) {
			s.kvc.Spec.Partitions = 3
			s.member(3).Learner = true
		}), wantPending: true, wantAction: ActRemove, wantMember: "kv-3", wantTo: 0},
		{name: "lost data: a member back on a new volume is removed, and that volume reset", s: formed(3, to).with(func(s *scenario) {
			s.member(1).Healthy = false
			s.obs.Pods[1] = Pod{UID: "pod-kv-1b", VolumeUID: "vol-new", Running: true, Restarts: 2}
		}), wantPending: true, wantAction: ActRemove, wantMember: "kv-1", wantTo: 0,
			check: func(t *testing.T, got Rollout) {
				if got.PodUID != "pod-kv-1b" || got.VolumeUID != "vol-new" {
					t.Errorf("resets pod %q and claim %q, want the pod and new claim observed (pod-kv-1b, vol-new)", got.PodUID, got.VolumeUID)
				}
			}},
		{name: "lost data: not for a member added back under the name (its new ID has no volume recorded yet)", s: formed(3, to).with(func(s *scenario) {
			s.member(1).ID, s.member(1).Healthy = 42, false
			s.obs.Pods[1] = Pod{UID: "pod-kv-1b", VolumeUID: "vol-new", Running: true}
		}), wantPending: false, wantAction: ActWait},
		{name: "lost data: its slot is filled by a new learner", s: formed(3, to).with(func(s *scenario) {
			s.obs.Cluster.Members = append(s.obs.Cluster.Members[:1], s.obs.Cluster.Members[2])
			s.obs.Pods[1] = Pod{UID: "pod-kv-1b", VolumeUID: "vol-new", Restarts: 3}
		}), wantPending: true, wantAction: ActAddLearner, wantMember: "kv-1", wantTo: 0},
		{name: "lost data: no learner is added while the pod of the reset volume stops (etcd there would join on it)", s: formed(3, to).with(func(s *scenario) {
			s.obs.Cluster.Members = append(s.obs.Cluster.Members[:1], s.obs.Cluster.Members[2])
			s.obs.Pods[1] = Pod{UID: "pod-kv-1b", VolumeUID: "vol-new", Running: true, Terminating: true}
		}), wantPending: true, wantAction: ActWait, wantAwaitsEvent: true, wantMember: "old pod to stop", wantTo: 0, wantReason: ReasonReplacingMember},
		{name: "lost data: a learner is not promoted while its pod is being stopped (its volume may go with it)", s: formed(3, to).with(func(s *scenario) {
			s.member(1).Learner = true
			p := s.obs.Pods[1]
			p.Terminating = true
			s.obs.Pods[1] = p
		}), wantPending: true, wantAction: ActWait, wantAwaitsEvent: true, wantMember: "being stopped", wantTo: 0, wantReason: ReasonScaling},
		{name: "lost data: a learner back on a new volume is removed, and that volume reset", s: formed(3, to).with(func(s *scenario) {
			s.member(1).Learner, s.member(1).Healthy = true, false
			s.obs.Pods[1] = Pod{UID: "pod-kv-1b", VolumeUID: "vol-new", Running: true, Restarts: 2}
		}), wantPending: true, wantAction: ActRemove, wantMember: "kv-1", wantTo: 0, wantReason: ReasonReplacingMember,
			check: func(t *testing.T, got Rollout) {
				if got.PodUID != "pod-kv-1b" || got.VolumeUID != "vol-new" {
					t.Errorf("resets pod %q and claim %q, want the pod and new claim observed (pod-kv-1b, vol-new)", got.PodUID, got.VolumeUID)
				}
			}},
		{name: "lost data: not removed when that would lose the quorum", s: formed(3, to).with(func(s *scenario) {
			s.member(1).Healthy = false
			s.member(2).Healthy = false
			s.obs.Pods[1] = Pod{UID: "pod-kv-1b", VolumeUID: "vol-new"}
		}), wantPending: true, wantAction: ActWait, wantMember: "quorum", wantTo: 0},
		{name: "no quorum: nothing is changed", s: formed(3, from).upgradeTo(to).with(func(s *scenario) { s.obs.Cluster = nil }), wantPending: true, wantAction: ActWait, wantMember: "quorum", wantTo: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planRollout(tt.s.kvc, tt.s.obs)
			if got.Pending != tt.wantPending || got.Action != tt.wantAction {
				t.Fatalf("planRollout = pending %t action %d (%s); want pending %t action %d", got.Pending, got.Action, got.Message, tt.wantPending, tt.wantAction)
			}
			if got.AwaitsEvent != tt.wantAwaitsEvent {
				t.Errorf("awaits a watched change: %t, want %t (%s)", got.AwaitsEvent, tt.wantAwaitsEvent, got.Message)
			}
			if got.Action == ActWait {
				if !strings.Contains(got.Message, tt.wantMember) {
					t.Errorf("message %q does not mention %q", got.Message, tt.wantMember)
				}
				return
			}
			if tt.wantMember != "" && fmt.Sprintf("kv-%d", got.Ordinal) != tt.wantMember {
				t.Errorf("acts on kv-%d (%s), want %s", got.Ordinal, got.Message, tt.wantMember)
			}
			if got.To != tt.wantTo {
				t.Errorf("moves leadership to %d, want %d", got.To, tt.wantTo)
			}
			if tt.wantReason != "" && got.Reason != tt.wantReason {
				t.Errorf("reason %s, want %s", got.Reason, tt.wantReason)
			}
			if tt.check != nil {
				tt.check(t, got)
			}
			// A deletion carries the UID it was decided on, so it never hits a pod or volume that
			// has been replaced since.
			pod := tt.s.obs.Pods[got.Ordinal]
			if (got.Action == ActRestartPod || got.Action == ActWipeLearner) && (got.PodUID == "" || got.PodUID != pod.UID) {
				t.Errorf("deletes pod UID %q, want the observed %q", got.PodUID, pod.UID)
			}
			if got.Action == ActWipeLearner && (got.VolumeUID == "" || got.VolumeUID != pod.VolumeUID) {
				t.Errorf("deletes volume UID %q, want the observed %q", got.VolumeUID, pod.VolumeUID)
			}
		})
	}
}

func TestDesiredMembershipFollowsEtcd(t *testing.T) {
	s := formed(3, "3.7.3")
	s.obs.Cluster.Members = append(s.obs.Cluster.Members, members.Member{ID: 9, Learner: true, PeerURLs: []string{"http://kv-3.kv-peer.ns.svc:2380"}})
	m, replicas := desiredMembership(s.kvc, s.obs)
	if m.State != "existing" || fmt.Sprint(m.Ordinals) != "[0 1 2 3]" || replicas != 4 {
		t.Errorf("with a learner added: %+v replicas %d; want existing [0 1 2 3] and 4 pods", m, replicas)
	}
	// A removed member leaves a hole: the pods above it keep running.
	s.obs.Cluster.Members = append(s.obs.Cluster.Members[:1], s.obs.Cluster.Members[2:]...)
	if m, replicas = desiredMembership(s.kvc, s.obs); fmt.Sprint(m.Ordinals) != "[0 2 3]" || replicas != 4 {
		t.Errorf("with kv-1 removed: %+v replicas %d", m, replicas)
	}
	// Without etcd's answer, what was written stays.
	s.obs.Cluster = nil
	s.obs.Membership = &m
	four := int32(4)
	s.obs.STSReplicas = &four
	if got, replicas := desiredMembership(s.kvc, s.obs); fmt.Sprint(got.Ordinals) != "[0 2 3]" || replicas != 4 {
		t.Errorf("without etcd: %+v replicas %d", got, replicas)
	}
	// A new cluster starts with every partition.
	s.kvc.Status.CurrentVersion = ""
	s.obs.Membership = nil
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
		{name: "formed", s: formed(3, "3.7.3"), want: 3},
		{name: "scaling up: the learner does not count", s: formed(3, "3.7.3").with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, members.Member{ID: 9, Learner: true})
		}), want: 3},
		{name: "scaling down: never more than the spec", s: formed(5, "3.7.3").with(func(s *scenario) { s.kvc.Spec.Partitions = 3 }), want: 3},
		{name: "etcd not answering: the last known members", s: formed(3, "3.7.3").with(func(s *scenario) {
			s.kvc.Spec.Partitions = 5
			s.obs.Cluster = nil
		}), want: 3},
		{name: "nothing known yet: the spec", s: formed(3, "3.7.3").with(func(s *scenario) {
			s.obs.Cluster = nil
			s.kvc.Status.Members = nil
		}), want: 3},
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
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, stranger)
			s.obs.Pods[0] = Pod{UID: "pod-kv-0", Restarts: 4, VolumeUID: "vol-kv-0"}
		})},
		{name: "an unknown started learner", s: formed(3, to).with(func(s *scenario) {
			m := stranger
			m.Name, m.Healthy = "intruder", true
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, m)
		})},
		{name: "an unknown voting member leads during an upgrade", s: formed(3, "3.6.16").upgradeTo(to).with(func(s *scenario) {
			m := stranger
			m.Name, m.Learner, m.Healthy = "intruder", false, true
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, m)
			s.leader(3)
		})},
		{name: "a member named like one of ours, at another address", s: formed(3, to).with(func(s *scenario) {
			m := stranger
			m.Name, m.Learner, m.Healthy = "kv-3", true, true
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, m)
			s.kvc.Spec.Partitions = 4
		})},
		{name: "two members claim one pod", s: formed(3, to).with(func(s *scenario) {
			m := *s.member(1)
			m.ID = 0x4d
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, m)
		})},
		{name: "an unknown member while scaling down", s: formed(3, to).with(func(s *scenario) {
			m := stranger
			m.Name, m.Learner, m.Healthy = "intruder", false, true
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, m)
			s.kvc.Spec.Partitions = 1
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planRollout(tt.s.kvc, tt.s.obs)
			if got.Action != ActWait || !got.Pending || got.Reason != ReasonUnknownMember {
				t.Fatalf("planRollout = action %d reason %q (%s); want to wait with reason %s", got.Action, got.Reason, got.Message, ReasonUnknownMember)
			}
			if !strings.Contains(got.Message, "4d") || !strings.Contains(got.Message, "member remove") {
				t.Errorf("message %q must name the member (ID 4d) and how to remove it", got.Message)
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
		p := s.obs.Pods[0]
		p.Ready = false
		s.obs.Pods[0] = p
		s.obs.ReadyMembers = 2
	})
	got := planRollout(lastRestarting.kvc, lastRestarting.obs)
	if !got.Pending || got.Action != ActWait || !strings.Contains(got.Message, "kv-0") {
		t.Fatalf("planRollout = pending %t action %d (%s); want to wait for kv-0", got.Pending, got.Action, got.Message)
	}
	st, v := decide(lastRestarting.kvc, lastRestarting.obs, got, t0)
	if v.phase != kvv1.PhaseUpgrading || st.CurrentVersion != from {
		t.Errorf("while the last member Restarts: phase %s, currentVersion %s; want Upgrading on %s", v.phase, st.CurrentVersion, from)
	}

	done := formed(3, from).upgradeTo(to).restarted(2).restarted(1).restarted(0).with(func(s *scenario) { s.kvc.Status.Phase = kvv1.PhaseUpgrading })
	st, v = decide(done.kvc, done.obs, planRollout(done.kvc, done.obs), t0)
	if v.phase != kvv1.PhaseReady || st.CurrentVersion != to {
		t.Errorf("once every member runs %s: phase %s, currentVersion %s; want Ready on %s", to, v.phase, st.CurrentVersion, to)
	}

	// A member that goes down after the upgrade finished is the Ready condition's business.
	after := formed(3, to).with(func(s *scenario) { s.member(1).Healthy = false })
	if got := planRollout(after.kvc, after.obs); got.Pending {
		t.Errorf("a member down after the upgrade is not a rollout: %s", got.Message)
	}
}
