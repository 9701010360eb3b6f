package chaos

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvcluster/kvcluster-operator/backup"
)

// Interval is a span of time; To is inclusive.
type Interval struct {
	From, To time.Time
	// Why it excuses a missed slot, for the message.
	Why string
}

// SlotJob is a scheduled backup Job as the monitor saw it.
type SlotJob struct {
	UID     string
	Created time.Time
}

// Invariants of scheduled backups.
const (
	OneJobPerSlot  = "exactly one backup Job per schedule slot"
	NoUnexcusedGap = "no slot missed unless the missed-slot rules allow it"
	NoLateSlot     = "no slot started once the next one was due"
	// startLatency is how long the operator may take to start a slot it is free to start.
	startLatency = 10 * time.Second
)

// SlotViolations checks the scheduled backup Jobs seen while a cluster lived, from to to (jobs:
// every Job seen, by its slot's Unix time), against the operator's missed-slot rules: no backup
// starts while another runs, while the cluster is being created, nor while the operator (or the
// API server) is down (excused); a slot kept from starting runs late once it may, unless the next
// slot is due by then: only the most recent missed slot runs. So each slot has exactly one Job,
// created before the next slot (give or take startLatency), unless excuses cover it until then.
func SlotViolations(schedule, timeZone string, from, to time.Time, jobs map[int64][]SlotJob, excused []Interval) ([]Violation, error) {
	sched, err := backup.Parse(schedule, timeZone, from)
	if err != nil {
		return nil, err
	}
	var out []Violation
	for _, key := range slices.Sorted(maps.Keys(jobs)) {
		slot := time.Unix(key, 0)
		uids := map[string]time.Time{}
		for _, j := range jobs[key] {
			uids[j.UID] = j.Created
		}
		if len(uids) > 1 {
			out = append(out, Violation{At: slot, Invariant: OneJobPerSlot,
				Message: fmt.Sprintf("the slot %s ran %d Jobs (%v)", slot.UTC().Format(time.RFC3339), len(uids), slices.Sorted(maps.Keys(uids)))})
		}
		next := sched.Next(slot)
		for _, created := range uids {
			if created.After(next.Add(startLatency)) {
				out = append(out, Violation{At: created, Invariant: NoLateSlot,
					Message: fmt.Sprintf("the slot %s started at %s, after the next slot %s was due", slot.UTC().Format(time.RFC3339),
						created.UTC().Format(time.RFC3339), next.UTC().Format(time.RFC3339))})
			}
		}
	}
	spans := merge(excused)
	for slot := sched.Next(from); !slot.IsZero() && !slot.After(to); slot = sched.Next(slot) {
		if _, ran := jobs[slot.Unix()]; ran {
			continue
		}
		// Missed rightly only when kept from starting until the next slot was (nearly) due.
		until := sched.Next(slot).Add(-startLatency)
		if slices.ContainsFunc(spans, func(i Interval) bool { return !slot.Before(i.From) && !until.After(i.To) }) {
			continue
		}
		out = append(out, Violation{At: slot, Invariant: NoUnexcusedGap,
			Message: fmt.Sprintf("no Job for the slot %s, though nothing kept it from starting until the next slot", slot.UTC().Format(time.RFC3339))})
	}
	return out, nil
}

// merge joins overlapping intervals, so excuses that follow each other cover what they span together.
func merge(in []Interval) []Interval {
	sorted := slices.SortedFunc(slices.Values(in), func(a, b Interval) int { return a.From.Compare(b.From) })
	var out []Interval
	for _, i := range sorted {
		if n := len(out); n > 0 && !i.From.After(out[n-1].To) {
			if i.To.After(out[n-1].To) {
				out[n-1].To = i.To
			}
			continue
		}
		out = append(out, i)
	}
	return out
}
