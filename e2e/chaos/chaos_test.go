package chaos

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// step is one sample: each member (a, b, c) Ready (R), running but not Ready (U) or not running
// (D), after faults hit some.
type step struct {
	at    int // seconds after t0
	hit   []string
	state string
}

func TestMembersBlameOnlyTheOperatorsOutages(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
		want  []string // invariants broken, in order
	}{
		{"a roll takes one member at a time", []step{
			{at: 0, state: "RRR"}, {at: 5, state: "DRR"}, {at: 10, state: "URR"}, {at: 20, state: "RRR"}, {at: 25, state: "RDR"}, {at: 40, state: "RRR"},
		}, nil},
		{"members never Ready yet are being created, not down", []step{
			{at: 0, state: "DDD"}, {at: 5, state: "RUD"}, {at: 6, state: "RDD"},
		}, nil},
		{"two members taken down with no fault", []step{
			{at: 0, state: "RRR"}, {at: 5, state: "DRR"}, {at: 6, state: "DDR"}, {at: 7, state: "DDU"},
		}, []string{OneMemberDown, QuorumKept}},
		{"members without a quorum to answer with are not taken down", []step{
			{at: 0, state: "RRR"}, {at: 5, hit: []string{"a"}, state: "RRR"}, {at: 6, state: "DRR"}, {at: 7, state: "DUU"}, {at: 20, state: "UUU"},
		}, nil},
		{"a fault racing a roll step is not the operator's doing", []step{
			{at: 0, state: "RRR"}, {at: 5, hit: []string{"a"}, state: "RRR"}, {at: 6, state: "DRR"}, {at: 8, state: "DDR"}, {at: 10, state: "DDU"},
		}, nil},
		{"a member taken down while a faulted one is dead", []step{
			{at: 0, state: "RRR"}, {at: 5, hit: []string{"a"}, state: "DRR"}, {at: 30, state: "DRR"}, {at: 31, state: "DDR"}, {at: 32, state: "DDU"},
		}, []string{NoStepOverDead}},
		{"a member taken down right after a faulted one came back", []step{
			{at: 0, state: "RRR"}, {at: 5, hit: []string{"a"}, state: "DRR"}, {at: 30, state: "URR"}, {at: 31, state: "UDR"}, {at: 40, state: "RUR"},
		}, nil},
		{"the fault explains the flicker after it, not an outage once settled", []step{
			{at: 0, state: "RRR"}, {at: 5, hit: []string{"a"}, state: "DRR"}, {at: 10, state: "RRR"}, {at: 12, state: "DRR"}, {at: 14, state: "DDR"},
			{at: 20, state: "RRR"}, {at: 60, state: "RRR"}, {at: 61, state: "DRR"}, {at: 62, state: "DDR"},
		}, []string{OneMemberDown, QuorumKept}},
		{"a freeze too short to down the member is over after a while", []step{
			{at: 0, state: "RRR"}, {at: 5, hit: []string{"a"}, state: "RRR"}, {at: 100, state: "RRR"},
			{at: 110, state: "DRR"}, {at: 111, state: "DDR"},
		}, []string{OneMemberDown, QuorumKept}},
		{"a violation is reported once, not per sample", []step{
			{at: 0, state: "RRR"}, {at: 1, state: "DDR"}, {at: 2, state: "DDR"}, {at: 3, state: "DDR"},
		}, []string{OneMemberDown, QuorumKept}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMembers()
			var got []string
			for _, s := range tc.steps {
				at := t0.Add(time.Duration(s.at) * time.Second)
				for _, h := range s.hit {
					m.Hit(h, at)
				}
				var members []Member
				for i, n := range []string{"a", "b", "c"} {
					members = append(members, Member{Name: n, Running: s.state[i] != 'D', Ready: s.state[i] == 'R'})
				}
				for _, v := range m.Observe(at, members) {
					got = append(got, v.Invariant)
					t.Log(v)
				}
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("violations %q, want %q", got, tc.want)
			}
		})
	}
}

func TestAMemberScaledAwayIsOverItsFault(t *testing.T) {
	m := NewMembers()
	m.Observe(t0, []Member{{Name: "a", Running: true, Ready: true}, {Name: "d", Running: true, Ready: true}})
	m.Hit("d", t0.Add(time.Second))
	m.Observe(t0.Add(2*time.Second), []Member{{Name: "a", Running: true, Ready: true}})
	if m.Faulted() {
		t.Error("a member no longer in the spec still counts as faulted: no member fault could be injected again")
	}
}

func TestSlotViolations(t *testing.T) {
	minute := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	ran := func(ms ...int) map[int64][]SlotJob {
		out := map[int64][]SlotJob{}
		for _, m := range ms {
			out[minute(m).Unix()] = []SlotJob{{UID: "uid-" + minute(m).Format("1504"), Created: minute(m).Add(time.Second)}}
		}
		return out
	}
	with := func(jobs map[int64][]SlotJob, m int, j SlotJob) map[int64][]SlotJob {
		jobs[minute(m).Unix()] = append(jobs[minute(m).Unix()], j)
		return jobs
	}
	down := func(from, to time.Time) []Interval { return []Interval{{From: from, To: to}} }
	for _, tc := range []struct {
		name    string
		jobs    map[int64][]SlotJob
		excused []Interval
		want    []string
	}{
		{"every slot ran", ran(1, 2, 3, 4, 5), nil, nil},
		{"a slot missed for nothing", ran(1, 2, 4, 5), nil, []string{NoUnexcusedGap}},
		{"a slot missed while the operator was down until the next one", ran(1, 2, 4, 5), down(minute(2).Add(30*time.Second), minute(4).Add(10*time.Second)), nil},
		{"excuses that follow each other cover the slot together", ran(1, 2, 4, 5),
			[]Interval{{From: minute(3).Add(-time.Second), To: minute(3).Add(30 * time.Second)}, {From: minute(3).Add(20 * time.Second), To: minute(4)}}, nil},
		{"a slot kept from starting for a while only must run late", ran(1, 2, 4, 5), down(minute(2).Add(30*time.Second), minute(3).Add(10*time.Second)), []string{NoUnexcusedGap}},
		{"an excuse that ended before the slot", ran(1, 2, 4, 5), down(minute(2), minute(3).Add(-time.Second)), []string{NoUnexcusedGap}},
		{"a slot run late, before the next one", with(ran(1, 2, 4, 5), 3, SlotJob{UID: "late", Created: minute(3).Add(40 * time.Second)}), nil, nil},
		{"a slot run after the next one was due", with(ran(1, 2, 4, 5), 3, SlotJob{UID: "late", Created: minute(4).Add(30 * time.Second)}), nil, []string{NoLateSlot}},
		{"a slot run twice", with(ran(1, 2, 3, 4, 5), 3, SlotJob{UID: "another", Created: minute(3).Add(2 * time.Second)}), nil, []string{OneJobPerSlot}},
		{"the same Job seen in many samples is one run", with(ran(1, 2, 3, 4, 5), 3, SlotJob{UID: "uid-1003", Created: minute(3).Add(time.Second)}), nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs, err := SlotViolations("*/1 * * * *", "", minute(0), minute(5), tc.jobs, tc.excused)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, v := range vs {
				got = append(got, v.Invariant)
				t.Log(v)
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("violations %q, want %q", got, tc.want)
			}
		})
	}
}

func TestTable(t *testing.T) {
	got := Table([]Row{{Scenario: "create", Runs: 2, Faults: 7}, {Scenario: "scale out and in", Runs: 2, Faults: 9, Violations: 1}})
	want := "" +
		"scenario            runs  faults  violations\n" +
		"create                 2       7           0\n" +
		"scale out and in       2       9           1\n" +
		"total                         16           1\n"
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}
