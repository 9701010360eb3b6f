package plan

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
)

const mib = 1 << 20

// sized gives every member of a formed 3-member cluster a 100 MiB quota and the database sizes
// given (MiB; in use: half of it).
func sized(sizes ...int64) *scenario {
	s := formed(3, "3.7.3")
	for i, size := range sizes {
		m := s.member(i)
		m.DBSize, m.DBSizeInUse, m.DBSizeQuota = size*mib, size*mib/2, 100*mib
	}
	return s
}

// withSpaceCondition records a previous SpacePressure condition, as the last status wrote it.
func (s *scenario) withSpaceCondition(status metav1.ConditionStatus, reason string) *scenario {
	s.kvc.Status.Conditions = append(s.kvc.Status.Conditions, metav1.Condition{Type: kvv1.ConditionSpacePressure, Status: status, Reason: reason})
	return s
}

// TestSpacePressure: the SpacePressure condition is True while a NOSPACE alarm makes the cluster
// refuse writes (the Ready condition then says WritesRefused) or a database passed 80% of the
// quota; a change is announced once (a Warning, or SpaceRecovered when it clears); an alarm the
// cluster inherited from a snapshot, and a moment without etcd's answer, change nothing.
func TestSpacePressure(t *testing.T) {
	ownAlarm := members.Alarm{MemberID: 2, Type: "NOSPACE"}
	stranger := members.Alarm{MemberID: 0x99, Type: "NOSPACE"}
	tests := []struct {
		name        string
		s           *scenario
		want        metav1.ConditionStatus // "" = no condition
		wantReason  string
		wantMessage string
		wantEvent   string
		wantReady   string
	}{
		{name: "room", s: sized(10, 20, 79), want: metav1.ConditionFalse, wantReason: ReasonSpaceAvailable, wantReady: ReasonClusterReady},
		{name: "a database at 80% of the quota", s: sized(10, 80, 20), want: metav1.ConditionTrue, wantReason: ReasonNearQuota,
			wantMessage: "kv-1 80Mi of 100Mi", wantEvent: ReasonNearQuota, wantReady: ReasonClusterReady},
		{name: "still near the quota: no second event", s: sized(10, 85, 20).withSpaceCondition(metav1.ConditionTrue, ReasonNearQuota),
			want: metav1.ConditionTrue, wantReason: ReasonNearQuota, wantReady: ReasonClusterReady},
		{name: "a NOSPACE alarm: writes refused", s: func() *scenario {
			s := sized(10, 100, 20).withSpaceCondition(metav1.ConditionTrue, ReasonNearQuota)
			s.obs.Cluster.Alarms = []members.Alarm{ownAlarm}
			return s
		}(), want: metav1.ConditionTrue, wantReason: ReasonNoSpace, wantMessage: "NOSPACE alarm (kv-1)", wantEvent: ReasonNoSpace, wantReady: ReasonWritesRefused},
		{name: "compacted and defragmented", s: sized(10, 30, 20).withSpaceCondition(metav1.ConditionTrue, ReasonNoSpace),
			want: metav1.ConditionFalse, wantReason: ReasonSpaceAvailable, wantEvent: EventSpaceRecovered, wantReady: ReasonClusterReady},
		{name: "an inherited alarm is no space problem", s: func() *scenario {
			s := sized(10, 10, 10)
			s.obs.Cluster.Alarms = []members.Alarm{stranger}
			return s
		}(), want: metav1.ConditionFalse, wantReason: ReasonSpaceAvailable, wantReady: ReasonWritesRefused},
		{name: "the member near the quota restarts: left as it was", s: func() *scenario {
			s := sized(10, 85, 20)
			s.kvc.Status = Make(s.kvc, s.obs, t0, Config{}).Status // it was seen near the quota
			s.member(1).Healthy, s.member(1).DBSize, s.member(1).DBSizeQuota = false, 0, 0
			return s
		}(), want: metav1.ConditionTrue, wantReason: ReasonNearQuota, wantMessage: "kv-1 85Mi of 100Mi", wantReady: ReasonMembersUnavailable},
		{name: "etcd does not answer: left as it was", s: func() *scenario {
			s := sized().withSpaceCondition(metav1.ConditionTrue, ReasonNearQuota)
			s.obs.Cluster, s.obs.EtcdErr = nil, members.ErrNoQuorum
			return s
		}(), want: metav1.ConditionTrue, wantReason: ReasonNearQuota, wantReady: ReasonMembersUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Make(tt.s.kvc, tt.s.obs, t0, Config{})
			c := meta.FindStatusCondition(p.Status.Conditions, kvv1.ConditionSpacePressure)
			if c == nil || c.Status != tt.want || c.Reason != tt.wantReason || !strings.Contains(c.Message, tt.wantMessage) {
				t.Errorf("SpacePressure = %+v, want %s %s mentioning %q", c, tt.want, tt.wantReason, tt.wantMessage)
			}
			var got []string
			for _, e := range p.Events {
				if e.Reason == ReasonNearQuota || e.Reason == ReasonNoSpace || e.Reason == EventSpaceRecovered {
					got = append(got, e.Reason)
				}
			}
			if strings.Join(got, ",") != tt.wantEvent {
				t.Errorf("space events %v, want %q", got, tt.wantEvent)
			}
			if ready := meta.FindStatusCondition(p.Status.Conditions, kvv1.ConditionReady); ready == nil || ready.Reason != tt.wantReady {
				t.Errorf("Ready = %+v, want reason %s", ready, tt.wantReady)
			}
			if tt.want == metav1.ConditionTrue && p.RequeueAfter > pollWhileProgressing {
				t.Errorf("looks again after %s; under space pressure, want every %s", p.RequeueAfter, pollWhileProgressing)
			}
		})
	}
}

// TestMemberStatusShowsSpace: each member's database size and size in use, rounded up to a MiB
// (so status changes once per MiB, not on every write), its alarms, and the quota; a member that
// does not answer keeps the sizes last seen.
func TestMemberStatusShowsSpace(t *testing.T) {
	s := sized(10, 20, 30)
	s.member(0).DBSize = 10*mib + 1 // rounds up
	s.obs.Cluster.Alarms = []members.Alarm{{MemberID: 3, Type: "NOSPACE"}}
	st := Make(s.kvc, s.obs, t0, Config{}).Status
	var got []string
	for _, m := range st.Members {
		got = append(got, m.Name+" "+m.DBSize.String()+"/"+m.DBSizeInUse.String()+" "+strings.Join(m.Alarms, ","))
	}
	if want := "kv-0 11Mi/5Mi |kv-1 20Mi/10Mi |kv-2 30Mi/15Mi NOSPACE"; strings.Join(got, "|") != want {
		t.Errorf("members %q, want %q", strings.Join(got, "|"), want)
	}
	if st.BackendQuota == nil || st.BackendQuota.String() != "100Mi" {
		t.Errorf("backendQuota %v, want 100Mi", st.BackendQuota)
	}

	s.kvc.Status = st
	s.member(1).Healthy = false
	s.member(1).DBSize, s.member(1).DBSizeInUse = 0, 0
	if m := Make(s.kvc, s.obs, t0, Config{}).Status.Members[1]; m.DBSize == nil || m.DBSize.String() != "20Mi" {
		t.Errorf("a member that did not answer: %+v, want its last sizes", m)
	}
	// Removed and added back under its name (its volume was lost): a new ID, not the old sizes.
	s.member(1).ID = 42
	if m := Make(s.kvc, s.obs, t0, Config{}).Status.Members[1]; m.DBSize != nil {
		t.Errorf("a member added back under a former member's name shows its sizes: %v", m.DBSize)
	}
	// etcd not answering: health and alarms are unknown, sizes stay as last seen.
	s.obs.Cluster, s.obs.EtcdErr = nil, members.ErrNoQuorum
	if m := Make(s.kvc, s.obs, t0, Config{}).Status.Members[2]; len(m.Alarms) != 0 || m.DBSize.String() != "30Mi" {
		t.Errorf("etcd not answering: %+v, want no alarms and the last sizes", m)
	}
}

// noSpace is sized (MiB) with the NOSPACE alarm etcd raised for member kv-1, at revision 900,
// as the last status announced it.
func noSpace(sizes ...int64) *scenario {
	s := sized(sizes...)
	for i := range s.obs.Cluster.Members {
		s.member(i).Revision, s.member(i).DBSizeQuota = 900, 100*mib
	}
	s.obs.Cluster.Alarms = []members.Alarm{{MemberID: 2, Type: "NOSPACE"}}
	return s.withSpaceCondition(metav1.ConditionTrue, ReasonNoSpace) // announced by the last reconcile
}

// defragmented: the database files of the members with these ordinals hold only what they use
// (MiB), in order.
func (s *scenario) defragmented(ordinals []int, inUse ...int64) *scenario {
	for i, size := range inUse {
		s.member(ordinals[i]).DBSize, s.member(ordinals[i]).DBSizeInUse = size*mib, size*mib
	}
	return s
}

// compacted: status records the operator's compaction to revision 900, a minute ago, and the
// members with these ordinals defragmented since, half a minute ago (the others an hour ago).
func (s *scenario) compacted(defragmentedSince ...int) *scenario {
	s.kvc.Status.LastCompaction = &kvv1.Compaction{Revision: 900, Time: metav1.NewMicroTime(t0.Add(-time.Minute))}
	for i := range s.kvc.Status.Members {
		at := metav1.NewMicroTime(t0.Add(-time.Hour))
		if slices.Contains(defragmentedSince, i) {
			at = metav1.NewMicroTime(t0.Add(-30 * time.Second))
		}
		s.kvc.Status.Members[i].ID, s.kvc.Status.Members[i].LastDefragmentTime = fmt.Sprintf("%x", s.member(i).ID), &at
	}
	return s
}

var all = []int{0, 1, 2}

// checkDefragmentTarget: the step names the member's own client URL, and says whether it leads
// the cluster as observed.
func checkDefragmentTarget(t *testing.T, s *scenario, f FreeSpace) {
	t.Helper()
	if !strings.Contains(f.Endpoint, "//"+f.Defragment+".") {
		t.Errorf("defragments %s at %s", f.Defragment, f.Endpoint)
	}
	if leader, _ := s.obs.Cluster.Leader(); f.Leader != (f.Defragment == leader.Name) {
		t.Errorf("defragments %s with Leader %v; the leader is %q", f.Defragment, f.Leader, leader.Name)
	}
}

// TestFreeSpace: under its own NOSPACE alarm a Ready cluster whose members all answer is compacted
// to the latest revision, then every member past 80% of the quota is defragmented once after it
// (followers first, the leader last), whatever it shows free, and any other member whose free
// pages are worth it; the alarm is disarmed once every database is below the mark; with no room
// even then, the condition says what a person can do. Nothing is done for an inherited alarm,
// during a rollout, or while a member does not answer.
func TestFreeSpace(t *testing.T) {
	tests := []struct {
		name       string
		s          *scenario
		want       string // FreeSpace summarised, see below
		wantReason string // of SpacePressure
		wantMsg    string
	}{
		{name: "no alarm", s: sized(99, 99, 99).defragmented(all, 99, 99, 99), want: "", wantReason: ReasonNearQuota},
		{name: "the alarm, not announced yet: announced first", s: func() *scenario {
			s := noSpace(100, 100, 100)
			s.kvc.Status.Conditions = nil
			return s
		}(), want: "", wantReason: ReasonNoSpace},
		{name: "the alarm: compact, on its own", s: noSpace(100, 100, 100), want: "compact 900",
			wantReason: ReasonNoSpace, wantMsg: "compacts every old revision away, defragments one member at a time, then disarms"},
		{name: "just compacted: recorded, and what it freed shows next time", s: func() *scenario {
			s := noSpace().defragmented(all, 100, 100, 100)
			s.obs.Compacted = 900
			return s
		}(), want: "look again", wantReason: ReasonNoSpace},
		{name: "compacted, the freed pages not shown yet: the first follower all the same", s: noSpace().defragmented(all, 100, 100, 100).compacted(),
			want: "defragment kv-1", wantReason: ReasonNoSpace},
		{name: "just defragmented: recorded, and the next one planned next time", s: func() *scenario {
			s := noSpace(100, 100, 100).compacted()
			s.obs.Defragmented = "kv-1"
			return s
		}(), want: "look again", wantReason: ReasonNoSpace},
		{name: "then the next follower", s: noSpace(100, 100, 100).defragmented([]int{1}, 82).compacted(1), want: "defragment kv-2", wantReason: ReasonNoSpace},
		{name: "the leader last", s: noSpace(100, 100, 100).defragmented([]int{1, 2}, 82, 82).compacted(1, 2), want: "defragment kv-0", wantReason: ReasonNoSpace},
		{name: "room: disarm, nothing to compact", s: noSpace().defragmented(all, 2, 2, 79), want: "disarm 2", wantReason: ReasonNoSpace},
		{name: "keys deleted since the pass ended: compact again", s: func() *scenario {
			s := noSpace().defragmented(all, 90, 90, 90).compacted(all...)
			s.kvc.Status.LastCompaction.Revision = 800
			return s
		}(), want: "compact 900", wantReason: ReasonNoSpace},
		{name: "keys deleted during the pass: the pass goes on first", s: func() *scenario {
			s := noSpace(100, 100, 100).defragmented([]int{1}, 82).compacted(1)
			s.kvc.Status.LastCompaction.Revision = 800
			return s
		}(), want: "defragment kv-2", wantReason: ReasonNoSpace},
		{name: "a new alarm after the last pass was disarmed, one member not defragmented in it: compact first", s: func() *scenario {
			s := noSpace(100, 100, 100).defragmented([]int{1}, 82).compacted(0, 1)
			s.kvc.Status.LastCompaction.Revision = 800
			disarmed := metav1.NewMicroTime(t0.Add(-20 * time.Second))
			s.kvc.Status.LastCompaction.DisarmedTime = &disarmed
			return s
		}(), want: "compact 900", wantReason: ReasonNoSpace},
		{name: "a new alarm long after the last pass: compact first", s: func() *scenario {
			s := noSpace(100, 100, 100).compacted()
			s.kvc.Status.LastCompaction.Revision = 800
			return s
		}(), want: "compact 900", wantReason: ReasonNoSpace},
		{name: "no room even then: say what to do", s: noSpace().defragmented(all, 90, 90, 90).compacted(all...), want: "exhausted",
			wantReason: ReasonSpaceExhausted, wantMsg: "raise spec.space.backendQuota (storage.size holds a quota of up to 626Mi), or grow storage.size"},
		{name: "no room, and the volume holds no larger quota: grow it", s: noSpace().defragmented(all, 90, 90, 90).compacted(all...).with(func(s *scenario) {
			s.kvc.Spec.Storage.Size = resource.MustParse("384Mi") // an earlier release's: holds 82Mi
		}), want: "exhausted", wantReason: ReasonSpaceExhausted, wantMsg: "disarms the alarm), or grow storage.size"},
		{name: "free pages under a MiB are not worth a second defragmentation", s: func() *scenario {
			s := noSpace().defragmented(all, 90, 90, 90).compacted(all...)
			s.member(0).DBSize += mib - 1
			return s
		}(), want: "exhausted", wantReason: ReasonSpaceExhausted},
		{name: "defragmented the microsecond before the compaction: again", s: func() *scenario {
			s := noSpace().defragmented(all, 90, 90, 90).compacted(all...)
			before := metav1.NewMicroTime(s.kvc.Status.LastCompaction.Time.Add(-time.Microsecond))
			s.kvc.Status.Members[1].LastDefragmentTime = &before
			return s
		}(), want: "defragment kv-1", wantReason: ReasonNoSpace},
		{name: "a member replaced since its defragmentation (another ID) is defragmented", s: func() *scenario {
			s := noSpace().defragmented(all, 90, 90, 90).compacted(all...)
			s.kvc.Status.Members[2].ID = "99"
			return s
		}(), want: "defragment kv-2", wantReason: ReasonNoSpace},
		{name: "a follower showing its compaction after its defragmentation: defragmented again", s: func() *scenario {
			s := noSpace().defragmented(all, 99, 99, 99).compacted(all...)
			s.member(1).DBSizeInUse = 2 * mib
			return s
		}(), want: "defragment kv-1", wantReason: ReasonNoSpace},
		{name: "packed looser than a defragmented member, past the mark: defragmented again", s: func() *scenario {
			s := noSpace().defragmented(all, 90, 78, 90).compacted(all...)
			s.member(0).DBSizeInUse, s.member(2).DBSizeInUse = 85*mib, 85*mib
			return s
		}(), want: "defragment kv-2", wantReason: ReasonNoSpace},
		{name: "under the mark, a tenth free: defragmented too", s: noSpace(100, 50, 50).compacted(all...).defragmented([]int{0}, 82),
			want: "defragment kv-1", wantReason: ReasonNoSpace},
		{name: "exhausted, and a compaction of newer revisions: the verdict stands until the sizes show more", s: func() *scenario {
			s := noSpace().defragmented(all, 90, 90, 90)
			s.kvc.Status.Conditions = nil
			s.withSpaceCondition(metav1.ConditionTrue, ReasonSpaceExhausted)
			s.obs.Compacted = 900
			return s
		}(), want: "exhausted", wantReason: ReasonSpaceExhausted},
		{name: "a database too large to defragment while it serves", s: func() *scenario {
			s := noSpace().compacted()
			for i := range 3 {
				s.member(i).DBSizeQuota, s.member(i).DBSize, s.member(i).DBSizeInUse = 8<<30, 7<<30, 1<<30
			}
			return s
		}(), want: "exhausted", wantReason: ReasonSpaceExhausted, wantMsg: "it does not defragment kv-1, kv-2, kv-0: larger than 2 GiB"},
		{name: "a member does not answer: wait", s: func() *scenario {
			s := noSpace(100, 100, 100)
			s.member(2).Healthy = false
			return s
		}(), want: "", wantReason: ReasonNoSpace, wantMsg: "it waits until every member answers"},
		{name: "during a rollout: wait", s: noSpace(100, 100, 100).upgradeTo("3.7.4"), want: "", wantReason: ReasonNoSpace, wantMsg: "it waits while the cluster is Upgrading"},
		{name: "a CORRUPT alarm too: a person's", s: func() *scenario {
			s := noSpace(100, 100, 100)
			s.obs.Cluster.Alarms = append(s.obs.Cluster.Alarms, members.Alarm{MemberID: 3, Type: "CORRUPT"})
			return s
		}(), want: "", wantReason: ReasonNoSpace, wantMsg: "it waits while etcd reports another alarm"},
		{name: "an inherited alarm is disarmed as stale, not freed", s: func() *scenario {
			s := noSpace(100, 100, 100)
			s.obs.Cluster.Alarms = []members.Alarm{{MemberID: 0x99, Type: "NOSPACE"}}
			return s
		}(), want: "", wantReason: ReasonNearQuota},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Make(tt.s.kvc, tt.s.obs, t0, Config{})
			f := p.FreeSpace
			var got []string
			if f.CompactTo > 0 {
				got = append(got, fmt.Sprintf("compact %d", f.CompactTo))
			}
			if f.Defragment != "" {
				got = append(got, "defragment "+f.Defragment)
				checkDefragmentTarget(t, tt.s, f)
			}
			for _, a := range f.Disarm {
				got = append(got, fmt.Sprintf("disarm %x", a.MemberID))
			}
			if f.Exhausted {
				got = append(got, "exhausted")
			}
			if f.Active && len(got) == 0 {
				got = append(got, "look again")
			}
			if strings.Join(got, ", ") != tt.want {
				t.Errorf("free space: %q, want %q", strings.Join(got, ", "), tt.want)
			}
			if f.Active != (tt.want != "") {
				t.Errorf("Active = %v", f.Active)
			}
			c := meta.FindStatusCondition(p.Status.Conditions, kvv1.ConditionSpacePressure)
			if c == nil || c.Reason != tt.wantReason || !strings.Contains(c.Message, tt.wantMsg) {
				t.Errorf("SpacePressure = %+v, want %s mentioning %q", c, tt.wantReason, tt.wantMsg)
			}
		})
	}
}

// TestFreeingSpaceIsRecorded: status records the operator's compaction (its revision and time,
// and when the alarm was disarmed after it) and, per member, when the operator last defragmented it; a member etcd knows by another ID
// since (replaced) starts without one, and a member that does not answer keeps its own.
func TestFreeingSpaceIsRecorded(t *testing.T) {
	s := noSpace(100, 100, 100).compacted(1)
	s.obs.Compacted, s.obs.Defragmented = 950, "kv-2"
	s.kvc.Status.Members[0].ID = "99"
	s.member(1).Healthy = false
	st := Make(s.kvc, s.obs, t0, Config{}).Status

	if c := st.LastCompaction; c == nil || c.Revision != 950 || !c.Time.Equal(&metav1.MicroTime{Time: t0}) || c.DisarmedTime != nil {
		t.Errorf("lastCompaction = %+v, want revision 950 at %s", c, t0)
	}
	s.obs.Compacted, s.obs.Defragmented, s.obs.Disarmed = 0, "", true
	if c := Make(s.kvc, s.obs, t0, Config{}).Status.LastCompaction; c == nil || c.Revision != 900 || c.DisarmedTime == nil || !c.DisarmedTime.Equal(&metav1.MicroTime{Time: t0}) {
		t.Errorf("after disarming: lastCompaction = %+v, want revision 900 disarmed at %s", c, t0)
	}
	want := map[string]*metav1.MicroTime{"kv-0": nil, "kv-1": {Time: t0.Add(-30 * time.Second)}, "kv-2": {Time: t0}}
	for _, m := range st.Members {
		if got := m.LastDefragmentTime; (got == nil) != (want[m.Name] == nil) || got != nil && !got.Equal(want[m.Name]) {
			t.Errorf("%s: lastDefragmentTime = %v, want %v", m.Name, got, want[m.Name])
		}
	}
}

// defragmentedAt records in status that the operator defragmented member i at this time.
func (s *scenario) defragmentedAt(i int, at time.Time) *scenario {
	t := metav1.NewMicroTime(at)
	s.kvc.Status.Members[i].ID, s.kvc.Status.Members[i].LastDefragmentTime = fmt.Sprintf("%x", s.member(i).ID), &t
	return s
}

// TestRoutineDefragmentation: with no NOSPACE alarm, a member whose file reached half the quota
// with a quarter of it free (or enough free to pass back under 80% of the quota) is defragmented,
// followers by name first and the leader last, each at most once an hour, or once per window of
// a schedule (which opens at a slot and lasts an hour); never with mode Off, during a rollout,
// while a member does not answer, an alarm is raised or a backup runs, nor a file over 2 GiB.
func TestRoutineDefragmentation(t *testing.T) {
	policy := func(mode kvv1.DefragmentationMode, schedule string) func(*scenario) *scenario {
		return func(s *scenario) *scenario {
			s.kvc.Spec.Space.Defragmentation = kvv1.DefragmentationSpec{Mode: mode, Schedule: schedule}
			return s
		}
	}
	tests := []struct {
		name string
		s    *scenario
		want string // the member defragmented
	}{
		{name: "half the quota, half of it free: the first follower", s: sized(60, 60, 60), want: "kv-1"},
		{name: "the followers done within the hour: the next follower", s: sized(60, 60, 60).defragmentedAt(1, t0.Add(-30*time.Minute)), want: "kv-2"},
		{name: "the followers done: the leader", s: sized(60, 60, 60).defragmentedAt(1, t0.Add(-30*time.Minute)).defragmentedAt(2, t0.Add(-20*time.Minute)), want: "kv-0"},
		{name: "defragmented over an hour ago and worth it again: again", s: sized(60, 60, 60).defragmentedAt(1, t0.Add(-61*time.Minute)), want: "kv-1"},
		{name: "below half the quota: not worth it", s: sized(49, 49, 49), want: ""},
		{name: "under a quarter free: not worth it", s: func() *scenario {
			s := sized(60, 60, 60)
			for i := range 3 {
				s.member(i).DBSizeInUse = 46 * mib
			}
			return s
		}(), want: ""},
		{name: "past the mark, enough free to pass back under it", s: func() *scenario {
			s := sized(60, 60, 60).defragmented(all, 60, 60, 60)
			s.member(2).DBSize, s.member(2).DBSizeInUse = 85*mib, 78*mib
			return s
		}(), want: "kv-2"},
		{name: "free pages under a MiB: not worth it", s: func() *scenario {
			s := sized(60, 60, 60).defragmented(all, 60, 60, 60)
			s.member(1).DBSize += mib - 1
			return s
		}(), want: ""},
		{name: "larger than 2 GiB: never while it serves", s: func() *scenario {
			s := sized()
			for i := range 3 {
				s.member(i).DBSizeQuota, s.member(i).DBSize, s.member(i).DBSizeInUse = 8<<30, 5<<30, 1<<30
			}
			return s
		}(), want: ""},
		{name: "mode Off", s: policy(kvv1.DefragmentationOff, "")(sized(60, 60, 60)), want: ""},
		{name: "a member does not answer", s: func() *scenario {
			s := sized(60, 60, 60)
			s.member(2).Healthy = false
			return s
		}(), want: ""},
		{name: "during a rollout", s: sized(60, 60, 60).upgradeTo("3.7.4"), want: ""},
		{name: "an alarm raised (CORRUPT)", s: func() *scenario {
			s := sized(60, 60, 60)
			s.obs.Cluster.Alarms = []members.Alarm{{MemberID: 3, Type: "CORRUPT"}}
			return s
		}(), want: ""},
		{name: "a backup runs", s: func() *scenario {
			s := sized(60, 60, 60)
			s.obs.Jobs = []Job{{Job: preUpgradeJob("3.7.3", "")}}
			return s
		}(), want: ""},
		{name: "outside the schedule's window", s: policy(kvv1.DefragmentationAuto, "0 3 * * *")(sized(60, 60, 60)), want: ""},
		{name: "the window closed a minute ago", s: policy(kvv1.DefragmentationAuto, "59 10 * * *")(sized(60, 60, 60)), want: ""},
		{name: "the window opened half an hour ago", s: policy(kvv1.DefragmentationAuto, "30 11 * * *")(sized(60, 60, 60)), want: "kv-1"},
		{name: "in the window, the first follower done in it: the next", s: policy(kvv1.DefragmentationAuto, "30 11 * * *")(sized(60, 60, 60).defragmentedAt(1, t0.Add(-20*time.Minute))), want: "kv-2"},
		{name: "a window opens: a member defragmented within the hour before is not again", s: policy(kvv1.DefragmentationAuto, "0 12 * * *")(sized(60, 60, 60).defragmentedAt(1, t0.Add(-20*time.Minute))), want: "kv-2"},
		{name: "every five minutes: still at most once an hour", s: policy(kvv1.DefragmentationAuto, "*/5 * * * *")(sized(60, 60, 60).defragmentedAt(1, t0.Add(-50*time.Minute))), want: "kv-2"},
		{name: "a member replaced since its defragmentation (another ID)", s: func() *scenario {
			s := sized(60, 60, 60).defragmentedAt(1, t0.Add(-10*time.Minute))
			s.kvc.Status.Members[1].ID = "99"
			return s
		}(), want: "kv-1"},
		{name: "in a zone's window", s: policy(kvv1.DefragmentationAuto, "CRON_TZ=Europe/Berlin 30 12 * * *")(sized(60, 60, 60)), want: "kv-1"},
		{name: "a zone that does not exist: nothing", s: policy(kvv1.DefragmentationAuto, "CRON_TZ=Nowhere/Land 30 12 * * *")(sized(60, 60, 60)), want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Make(tt.s.kvc, tt.s.obs, t0, Config{})
			f := p.FreeSpace
			if f.Defragment != tt.want || f.Active || f.CompactTo != 0 {
				t.Errorf("defragment %q (active %v, compact %d); want %q", f.Defragment, f.Active, f.CompactTo, tt.want)
			}
			if f.Defragment != "" {
				checkDefragmentTarget(t, tt.s, f)
			}
		})
	}
}

// TestDefragmentationScheduleProblem: a schedule admission cannot check (an unknown zone, no slot
// ever) is announced once per spec, as the spec changes.
func TestDefragmentationScheduleProblem(t *testing.T) {
	for _, tt := range []struct {
		schedule   string
		observed   int64
		wantWarned bool
	}{
		{schedule: "0 3 * * *", observed: 0},
		{schedule: "CRON_TZ=Nowhere/Land 0 3 * * *", observed: 0, wantWarned: true},
		{schedule: "0 0 31 2 *", observed: 0, wantWarned: true},
		{schedule: "0 0 31 2 *", observed: 1}, // announced for this generation already
	} {
		s := sized(10, 10, 10)
		s.kvc.Spec.Space.Defragmentation.Schedule = tt.schedule
		s.kvc.Status.ObservedGeneration = tt.observed
		var warned []string
		for _, e := range Make(s.kvc, s.obs, t0, Config{}).Events {
			if e.Reason == EventInvalidDefragmentationSchedule {
				warned = append(warned, e.Message)
			}
		}
		if (len(warned) == 1) != tt.wantWarned || len(warned) > 1 {
			t.Errorf("%q, observed generation %d: warned %q, want a warning: %v", tt.schedule, tt.observed, warned, tt.wantWarned)
		}
	}
}

// TestDefragmentRequest: kvcluster.io/defragment-now=<token> defragments every member once, the
// followers by name and the leader last, one a reconcile, recorded in status.defragmentRequest; a
// token is answered once, a new one waits for the running one, and it waits like routine
// defragmentation does (not Ready, a member away, an alarm, a backup running), whatever
// spec.space.defragmentation says.
func TestDefragmentRequest(t *testing.T) {
	started := metav1.NewTime(t0.Add(-time.Minute))
	asked := func(token string, prev *kvv1.DefragmentRequest) func(*scenario) *scenario {
		return func(s *scenario) *scenario {
			if token != "" {
				s.kvc.Annotations = map[string]string{kvv1.AnnotationDefragmentNow: token}
			}
			s.kvc.Status.DefragmentRequest = prev
			return s
		}
	}
	running := func(token string, done ...string) *kvv1.DefragmentRequest {
		return &kvv1.DefragmentRequest{Token: token, State: kvv1.BackupRequestRunning, StartTime: &started, Defragmented: done}
	}
	just := func(name string) func(*scenario) *scenario {
		return func(s *scenario) *scenario { s.obs.Defragmented = name; return s }
	}
	tests := []struct {
		name       string
		s          *scenario
		want       string // the member defragmented
		wantState  kvv1.BackupRequestState
		wantToken  string
		wantDone   []string
		wantEvent  string
		wantInText string // in the request's message
	}{
		{name: "a new token: the first follower, announced", s: asked("t1", nil)(sized(10, 10, 10)),
			want: "kv-1", wantState: kvv1.BackupRequestRunning, wantToken: "t1", wantEvent: EventDefragmentationStarted},
		{name: "the first just done (status not written yet): recorded, the next follower", s: just("kv-1")(asked("t1", &kvv1.DefragmentRequest{Token: "t1", State: kvv1.BackupRequestPending})(sized(10, 10, 10))),
			want: "kv-2", wantState: kvv1.BackupRequestRunning, wantToken: "t1", wantDone: []string{"kv-1"}, wantEvent: EventDefragmentationStarted},
		{name: "the followers done: the leader", s: just("kv-2")(asked("t1", running("t1", "kv-1"))(sized(10, 10, 10))),
			want: "kv-0", wantState: kvv1.BackupRequestRunning, wantToken: "t1", wantDone: []string{"kv-1", "kv-2"}},
		{name: "every member done: succeeded, announced", s: just("kv-0")(asked("t1", running("t1", "kv-1", "kv-2"))(sized(10, 10, 10))),
			wantState: kvv1.BackupRequestSucceeded, wantToken: "t1", wantDone: []string{"kv-1", "kv-2", "kv-0"}, wantEvent: EventDefragmentationFinished},
		{name: "answered: never again, and routine defragmentation goes on", s: asked("t1", &kvv1.DefragmentRequest{Token: "t1", State: kvv1.BackupRequestSucceeded})(sized(60, 60, 60)),
			want: "kv-1", wantState: kvv1.BackupRequestSucceeded, wantToken: "t1"},
		{name: "a new token after an answered one: a new request", s: asked("t2", &kvv1.DefragmentRequest{Token: "t1", State: kvv1.BackupRequestSucceeded, Defragmented: []string{"kv-0", "kv-1", "kv-2"}})(sized(10, 10, 10)),
			want: "kv-1", wantState: kvv1.BackupRequestRunning, wantToken: "t2", wantEvent: EventDefragmentationStarted},
		{name: "a new token while one runs: that one goes on first", s: asked("t2", running("t1", "kv-1"))(sized(10, 10, 10)),
			want: "kv-2", wantState: kvv1.BackupRequestRunning, wantToken: "t1", wantDone: []string{"kv-1"}},
		{name: "the annotation removed while running: finished", s: asked("", running("t1", "kv-1"))(sized(10, 10, 10)),
			want: "kv-2", wantState: kvv1.BackupRequestRunning, wantToken: "t1", wantDone: []string{"kv-1"}},
		{name: "the annotation removed before it started: failed", s: asked("", &kvv1.DefragmentRequest{Token: "t1", State: kvv1.BackupRequestPending})(sized(10, 10, 10).upgradeTo("3.7.4")),
			wantState: kvv1.BackupRequestFailed, wantToken: "t1", wantEvent: EventDefragmentationFailed, wantInText: "removed"},
		{name: "a token too long: failed, announced", s: asked(strings.Repeat("x", 64), nil)(sized(10, 10, 10)),
			wantState: kvv1.BackupRequestFailed, wantToken: strings.Repeat("x", 64), wantEvent: EventDefragmentationFailed, wantInText: "64 characters"},
		{name: "during a rollout: waits", s: asked("t1", nil)(sized(60, 60, 60).upgradeTo("3.7.4")),
			wantState: kvv1.BackupRequestPending, wantToken: "t1", wantInText: "Upgrading"},
		{name: "a member does not answer: waits", s: asked("t1", running("t1", "kv-1"))(func() *scenario {
			s := sized(10, 10, 10)
			s.member(2).Healthy = false
			return s
		}()), wantState: kvv1.BackupRequestRunning, wantToken: "t1", wantDone: []string{"kv-1"}, wantInText: "every member"},
		{name: "a backup runs: waits", s: asked("t1", nil)(func() *scenario {
			s := sized(10, 10, 10)
			s.obs.Jobs = []Job{{Job: preUpgradeJob("3.7.3", "")}}
			return s
		}()), wantState: kvv1.BackupRequestPending, wantToken: "t1", wantInText: "backup"},
		{name: "with mode Off too", s: asked("t1", nil)(func() *scenario {
			s := sized(10, 10, 10)
			s.kvc.Spec.Space.Defragmentation.Mode = kvv1.DefragmentationOff
			return s
		}()), want: "kv-1", wantState: kvv1.BackupRequestRunning, wantToken: "t1", wantEvent: EventDefragmentationStarted},
		{name: "a member too large to defragment while it serves: the others, then failed", s: asked("t1", running("t1", "kv-1"))(func() *scenario {
			s := sized(10, 10, 10)
			s.member(2).DBSize = 3 << 30
			s.obs.Defragmented = "kv-0"
			return s
		}()), wantState: kvv1.BackupRequestFailed, wantToken: "t1", wantDone: []string{"kv-1", "kv-0"}, wantEvent: EventDefragmentationFailed, wantInText: "not kv-2"},
		{name: "under NOSPACE: the operator frees space its way, the request waits", s: asked("t1", nil)(noSpace(100, 100, 100).withSpaceCondition(metav1.ConditionTrue, ReasonNoSpace)),
			wantState: kvv1.BackupRequestPending, wantToken: "t1", wantInText: "alarm"},
		{name: "a member just defragmented under NOSPACE is not the request's", s: just("kv-1")(asked("t1", nil)(noSpace(100, 100, 100).compacted().withSpaceCondition(metav1.ConditionTrue, ReasonNoSpace))),
			wantState: kvv1.BackupRequestPending, wantToken: "t1", wantInText: "alarm"},
		{name: "a new token replaces one still pending", s: asked("t2", &kvv1.DefragmentRequest{Token: "t1", State: kvv1.BackupRequestPending, Message: "waiting"})(sized(10, 10, 10)),
			want: "kv-1", wantState: kvv1.BackupRequestRunning, wantToken: "t2", wantEvent: EventDefragmentationStarted},
		{name: "an open request holds routine defragmentation back: its own next member, not routine's", s: asked("t1", running("t1", "kv-1"))(sized(60, 60, 60)),
			want: "kv-2", wantState: kvv1.BackupRequestRunning, wantToken: "t1", wantDone: []string{"kv-1"}},
		{name: "a scheduled backup starting in this reconcile: waits", s: asked("t1", nil)(func() *scenario {
			s := sized(10, 10, 10)
			s.kvc.Spec.BackupSchedule = "0 12 * * *" // due at t0
			s.kvc.Spec.Backup = &kvv1.BackupSpec{JobHistoryLimit: 2, S3: &kvv1.S3Destination{Endpoint: "s3:7070", Bucket: "b", CredentialsSecret: "s"}}
			return s
		}()), wantState: kvv1.BackupRequestPending, wantToken: "t1", wantInText: "waiting for backup kv-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Make(tt.s.kvc, tt.s.obs, t0, Config{})
			if f := p.FreeSpace; f.Defragment != tt.want || f.Defragment != "" && f.Requested == "" && tt.wantState == kvv1.BackupRequestRunning {
				t.Errorf("defragment %q (asked for with %q); want %q", f.Defragment, f.Requested, tt.want)
			}
			if f := p.FreeSpace; f.Defragment != "" {
				checkDefragmentTarget(t, tt.s, f)
			}
			req := p.Status.DefragmentRequest
			if req == nil {
				t.Fatal("status.defragmentRequest is unset")
			}
			if req.State != tt.wantState || req.Token != tt.wantToken || !slices.Equal(req.Defragmented, tt.wantDone) || !strings.Contains(req.Message, tt.wantInText) {
				t.Errorf("request %+v; want %s for %s, done %v, message with %q", *req, tt.wantState, tt.wantToken, tt.wantDone, tt.wantInText)
			}
			if req.State == kvv1.BackupRequestRunning && req.StartTime == nil {
				t.Error("running without a start time")
			}
			var reasons []string
			for _, e := range p.Events {
				if strings.HasPrefix(e.Reason, "Defragmentation") {
					reasons = append(reasons, e.Reason)
				}
			}
			if want := []string{tt.wantEvent}; tt.wantEvent == "" && len(reasons) > 0 || tt.wantEvent != "" && !slices.Equal(reasons, want) {
				t.Errorf("events %v, want %q", reasons, tt.wantEvent)
			}
		})
	}
}
