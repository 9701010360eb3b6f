// Package chaos holds what the chaos suite (e2e/chaos_test.go, `make chaos`) decides without a
// cluster: which member outages are the operator's doing, which missed backup slots are excused,
// and the table it ends with. Pure, so each rule is tested on its own, with cases it must catch.
package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Member is one member pod as a sample sees it (a member of the spec: an ordinal below both the
// StatefulSet's replicas and spec.partitions).
type Member struct {
	Name string
	// Running: the pod exists, is not being deleted and its etcd runs. A member that is not
	// running was taken down (or crashed); one running but not Ready may only be catching up,
	// frozen, or without a quorum to answer with.
	Running bool
	Ready   bool
}

// Violation is an invariant broken at a moment.
type Violation struct {
	At        time.Time
	Invariant string
	Message   string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s at %s: %s", v.Invariant, v.At.UTC().Format("15:04:05"), v.Message)
}

// Invariants the member tracker checks.
const (
	OneMemberDown   = "never more than one member taken down by the operator"
	NoStepOverDead  = "no member taken down while another is down"
	QuorumKept      = "quorum never lost by the operator"
	faultGrace      = 10 * time.Second // the operator cannot have seen a fault sooner
	faultSettle     = 30 * time.Second // Ready this long after a fault, a member is over it
	faultNeverDowns = 90 * time.Second // a fault that downed nothing by then (a short freeze) is over
)

type memberState struct {
	established bool      // Ready once since the tracker began: a member, not a joining one
	downSince   time.Time // not running since; zero while running
	readySince  time.Time // Ready since; zero while not
	hitAt       time.Time // the last fault aimed at it; zero once it is over it
	hitDowned   bool      // it was not Ready after that fault
}

// Members follows the member pods sample by sample and tells the outages a fault explains from the
// ones the operator caused. A fault (Hit) explains a member's outages, and their knock-on effects,
// until the member has been Ready for faultSettle after it. A member never Ready yet (being
// created, or joining) is not counted.
type Members struct {
	state    map[string]*memberState
	reported map[string]bool // one report per invariant and set of members, not one per sample
}

func NewMembers() *Members {
	return &Members{state: map[string]*memberState{}, reported: map[string]bool{}}
}

func (m *Members) member(name string) *memberState {
	s := m.state[name]
	if s == nil {
		s = &memberState{}
		m.state[name] = s
	}
	return s
}

// Hit records a fault aimed at a member (killed, frozen, its pod or volume deleted) at at.
func (m *Members) Hit(name string, at time.Time) {
	s := m.member(name)
	s.hitAt, s.hitDowned = at, false
}

// Faulted is true while a member is not over a fault yet.
func (m *Members) Faulted() bool {
	for _, s := range m.state {
		if !s.hitAt.IsZero() {
			return true
		}
	}
	return false
}

// Observe takes one sample of the members and returns the violations it shows that were not
// reported before.
func (m *Members) Observe(at time.Time, members []Member) []Violation {
	// A member gone from the spec (scaled in) is over its faults.
	for name, s := range m.state {
		if !slices.ContainsFunc(members, func(mem Member) bool { return mem.Name == name }) {
			s.hitAt, s.downSince, s.readySince = time.Time{}, time.Time{}, time.Time{}
		}
	}
	var takenDown, faulted []string
	established, ready := 0, 0
	for _, mem := range members {
		s := m.member(mem.Name)
		if mem.Ready {
			s.established = true
			if s.readySince.IsZero() {
				s.readySince = at
			}
		} else {
			s.readySince = time.Time{}
		}
		if mem.Running {
			s.downSince = time.Time{}
		} else if s.downSince.IsZero() {
			s.downSince = at
		}
		if !s.hitAt.IsZero() {
			s.hitDowned = s.hitDowned || !mem.Ready
			over := (s.hitDowned && !s.readySince.IsZero() && at.Sub(s.readySince) >= faultSettle) ||
				(!s.hitDowned && at.Sub(s.hitAt) >= faultNeverDowns)
			if over {
				s.hitAt = time.Time{}
			}
		}
		if !s.established {
			continue
		}
		established++
		switch {
		case mem.Ready:
			ready++
		case !s.hitAt.IsZero():
			faulted = append(faulted, mem.Name)
		case !mem.Running:
			takenDown = append(takenDown, mem.Name)
		}
	}

	var out []Violation
	report := func(invariant, key, msg string) {
		if key = invariant + " " + key; !m.reported[key] {
			m.reported[key] = true
			out = append(out, Violation{At: at, Invariant: invariant, Message: msg})
		}
	}
	if len(takenDown) > 1 {
		report(OneMemberDown, strings.Join(takenDown, ","), fmt.Sprintf("%s, none of them by a fault", m.since(takenDown)))
	}
	// The operator checks the members' health right before a step: one it takes down while
	// another's etcd has not been running for a while is a step over a dead member.
	for _, x := range takenDown {
		for _, y := range faulted {
			if ys := m.state[y]; !ys.downSince.IsZero() && ys.downSince.Add(faultGrace).Before(m.state[x].downSince) {
				report(NoStepOverDead, x+"/"+y, fmt.Sprintf("%s, while %s was down from a fault (%s)", m.since([]string{x}), y, m.since([]string{y})))
			}
		}
	}
	if established > 0 && ready < established/2+1 && len(faulted) == 0 && len(takenDown) > 0 {
		report(QuorumKept, strings.Join(takenDown, ","), fmt.Sprintf("%d of %d members Ready, no fault in play; taken down: %s", ready, established, m.since(takenDown)))
	}
	return out
}

func (m *Members) since(names []string) string {
	parts := make([]string, 0, len(names))
	for _, n := range slices.Sorted(slices.Values(names)) {
		parts = append(parts, fmt.Sprintf("%s down since %s", n, m.state[n].downSince.UTC().Format("15:04:05")))
	}
	return strings.Join(parts, ", ")
}
