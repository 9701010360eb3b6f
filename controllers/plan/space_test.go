package plan

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
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

var all = []int{0, 1, 2}

// TestFreeSpace: under its own NOSPACE alarm a Ready cluster whose members all answer is compacted
// to the latest revision, its members defragmented one at a time (followers first, the leader
// last, only those with free pages worth it), and the alarm disarmed once every database is below
// 80% of the quota; with no room even then, the condition says what a person can do. Nothing is
// done for an inherited alarm, during a rollout, or while a member does not answer.
func TestFreeSpace(t *testing.T) {
	tests := []struct {
		name       string
		s          *scenario
		want       string // FreeSpace summarised, see below
		wantReason string // of SpacePressure
		wantMsg    string
	}{
		{name: "no alarm", s: sized(99, 99, 99), want: "", wantReason: ReasonNearQuota},
		{name: "the alarm, not announced yet: announced first", s: func() *scenario {
			s := noSpace(100, 100, 100)
			s.kvc.Status.Conditions = nil
			return s
		}(), want: "", wantReason: ReasonNoSpace},
		{name: "the alarm: compact, then the first follower", s: noSpace(100, 100, 100), want: "compact 900, defragment kv-1",
			wantReason: ReasonNoSpace, wantMsg: "compacts every old revision away, defragments one member at a time, then disarms"},
		{name: "just compacted, nothing worth defragmenting in the sizes read before: no verdict, look again", s: func() *scenario {
			s := noSpace().defragmented(all, 100, 100, 100)
			s.obs.Compacted = true
			return s
		}(), want: "look again", wantReason: ReasonNoSpace},
		{name: "then the next follower", s: noSpace(100, 100, 100).defragmented([]int{1}, 2), want: "compact 900, defragment kv-2", wantReason: ReasonNoSpace},
		{name: "the leader last", s: noSpace(100, 100, 100).defragmented([]int{1, 2}, 2, 2), want: "compact 900, defragment kv-0", wantReason: ReasonNoSpace},
		{name: "room: disarm, nothing to compact", s: noSpace().defragmented(all, 2, 2, 79), want: "disarm 2", wantReason: ReasonNoSpace},
		{name: "free pages under a MiB are not worth defragmenting", s: func() *scenario {
			s := noSpace().defragmented(all, 90, 90, 90)
			s.member(0).DBSize += mib - 1
			return s
		}(), want: "compact 900, exhausted", wantReason: ReasonSpaceExhausted},
		{name: "only the leader has applied the compaction yet: it waits for the followers, and is not defragmented first", s: func() *scenario {
			s := noSpace().defragmented(all, 99, 99, 99)
			s.member(0).DBSizeInUse = 2 * mib
			return s
		}(), want: "compact 900", wantReason: ReasonNoSpace, wantMsg: "it waits for the compaction to reach every member"},
		{name: "a follower shows the compaction late, with some free pages: defragmented in its turn", s: func() *scenario {
			s := noSpace().defragmented(all, 99, 99, 99)
			s.member(0).DBSizeInUse = 2 * mib
			s.member(1).DBSizeInUse = 90 * mib
			return s
		}(), want: "compact 900, defragment kv-1", wantReason: ReasonNoSpace},
		{name: "packed looser than a defragmented member, past the mark: defragmented, not waited for", s: func() *scenario {
			s := noSpace().defragmented(all, 90, 78, 90)
			s.member(0).DBSizeInUse, s.member(2).DBSizeInUse = 85*mib, 85*mib
			return s
		}(), want: "compact 900, defragment kv-2", wantReason: ReasonNoSpace},
		{name: "exhausted, and a compaction of newer revisions: still exhausted until the sizes show more", s: func() *scenario {
			s := noSpace().defragmented(all, 90, 90, 90)
			s.kvc.Status.Conditions = nil
			s.withSpaceCondition(metav1.ConditionTrue, ReasonSpaceExhausted)
			s.obs.Compacted = true
			return s
		}(), want: "exhausted", wantReason: ReasonSpaceExhausted},
		{name: "one follower has applied it: that one", s: func() *scenario {
			s := noSpace().defragmented(all, 99, 99, 99)
			s.member(2).DBSizeInUse = 2 * mib
			return s
		}(), want: "compact 900, defragment kv-2", wantReason: ReasonNoSpace},
		{name: "under a tenth free, but enough to pass back under the mark", s: func() *scenario {
			s := noSpace().defragmented(all, 2, 2, 2)
			s.member(2).DBSize, s.member(2).DBSizeInUse = 85*mib, 78*mib
			return s
		}(), want: "compact 900, defragment kv-2", wantReason: ReasonNoSpace},
		{name: "no room even then: say what to do", s: noSpace().defragmented(all, 90, 90, 90), want: "compact 900, exhausted",
			wantReason: ReasonSpaceExhausted, wantMsg: "Delete keys that are no longer needed"},
		{name: "a database too large to defragment while it serves", s: func() *scenario {
			s := noSpace()
			for i := range 3 {
				s.member(i).DBSizeQuota, s.member(i).DBSize, s.member(i).DBSizeInUse = 8<<30, 7<<30, 1<<30
			}
			return s
		}(), want: "compact 900, exhausted", wantReason: ReasonSpaceExhausted, wantMsg: "it does not defragment kv-1, kv-2, kv-0: larger than 2 GiB"},
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
				if !strings.Contains(f.Endpoint, "//"+f.Defragment+".") {
					t.Errorf("defragments %s at %s", f.Defragment, f.Endpoint)
				}
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
