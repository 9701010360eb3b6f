package backup

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // the operator image has no zoneinfo; time zones must still resolve

	"github.com/robfig/cron/v3"
)

// parser accepts the standard 5 fields (minute hour day-of-month month day-of-week) and the
// @yearly/@monthly/@weekly/@daily/@hourly descriptors; never a seconds field, so a 6-field schedule
// cannot silently turn "daily" into "hourly".
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ErrNeverFires is returned for a schedule that parses but has no slot, like "59 23 31 2 *".
var ErrNeverFires = errors.New("the schedule never fires")

// Schedule is a parsed backup schedule.
type Schedule struct {
	cron cron.Schedule
}

// Parse parses a backup schedule in the given IANA time zone ("" means UTC). It never panics:
// robfig/cron panics on some inputs (e.g. "TZ=0"), which become errors here. now is used only to
// check that the schedule fires at all.
func Parse(expr, timeZone string, now time.Time) (s Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("invalid schedule %q: %v", expr, r)
		}
	}()
	expr = strings.TrimSpace(expr)
	if strings.HasPrefix(expr, "@every") {
		return Schedule{}, fmt.Errorf("invalid schedule %q: @every has no fixed slots; use a cron expression such as '0 */6 * * *'", expr)
	}
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		if timeZone != "" {
			return Schedule{}, fmt.Errorf("invalid schedule %q: the time zone is given both in the schedule and in the time zone field; keep one", expr)
		}
	} else if timeZone != "" {
		if _, err := time.LoadLocation(timeZone); err != nil {
			return Schedule{}, fmt.Errorf("unknown time zone %q: %v", timeZone, err)
		}
		expr = "CRON_TZ=" + timeZone + " " + expr
	}
	sched, err := parser.Parse(expr)
	if err != nil {
		return Schedule{}, fmt.Errorf("invalid schedule %q: %w", expr, err)
	}
	if sched.Next(now).IsZero() {
		return Schedule{}, fmt.Errorf("invalid schedule %q: %w", expr, ErrNeverFires)
	}
	return Schedule{cron: sched}, nil
}

// Next is the first slot after t. robfig/cron may answer a time its schedule does not match
// where DST starts at midnight: its search steps from 23:00 over the missing hour into the next
// day without checking the day again (a Saturday 01:00 schedule answered Sunday 01:00 in
// America/Santiago). Such a time is passed over.
func (s Schedule) Next(t time.Time) time.Time {
	next := s.cron.Next(t)
	for !next.IsZero() && !s.matches(next) {
		next = s.cron.Next(next)
	}
	return next
}

// matches says whether t is a time of the schedule, as robfig/cron's fields define it (the day
// of the month and of the week both, or either when neither is "*").
func (s Schedule) matches(t time.Time) bool {
	spec, ok := s.cron.(*cron.SpecSchedule)
	if !ok {
		return true
	}
	t = t.In(spec.Location)
	has := func(field uint64, v int) bool { return field&(1<<uint(v)) != 0 }
	const star = 1 << 63 // robfig/cron's mark of a field given as "*"
	dom, dow := has(spec.Dom, t.Day()), has(spec.Dow, int(t.Weekday()))
	day := dom || dow
	if spec.Dom&star != 0 || spec.Dow&star != 0 {
		day = dom && dow
	}
	return day && has(spec.Month, int(t.Month())) && has(spec.Hour, t.Hour()) && has(spec.Minute, t.Minute()) && has(spec.Second, t.Second())
}

// LongestGap is the longest time between two consecutive slots of the span after from (and the
// gap that crosses its end): the interval a backup may be expected within. A span of a year holds
// every pause of a schedule (a weekend, the days of a month without slots, months without any).
// The slots looked at are bounded: 20,000 is nearly 14 days of a slot every minute.
func (s Schedule) LongestGap(from time.Time, span time.Duration) time.Duration {
	const maxSlots = 20000
	var longest time.Duration
	prev := s.Next(from)
	for range maxSlots {
		next := s.Next(prev)
		if next.IsZero() {
			break
		}
		longest = max(longest, next.Sub(prev))
		if next.After(from.Add(span)) {
			break
		}
		prev = next
	}
	return longest
}

// MostRecentSlot is the latest slot in (after, now], or the zero time when there is none. after
// is the slot that last ran (or when scheduling began), so a slot never runs twice. Slots older
// than the starting deadline are not run at all: only the most recent missed slot can run, and
// only while it is fresh enough; skipped counts the due slots that will never run.
func (s Schedule) MostRecentSlot(after, now time.Time, startingDeadline time.Duration) (slot time.Time, skipped int) {
	if startingDeadline > 0 && after.Before(now.Add(-startingDeadline)) {
		// Slots before the deadline window will not run; count them without keeping them.
		windowStart := now.Add(-startingDeadline)
		for t := s.Next(after); !t.IsZero() && t.Before(windowStart) && skipped < maxCountedSkips; t = s.Next(t) {
			skipped++
		}
		after = windowStart.Add(-time.Nanosecond)
	}
	for t := s.Next(after); !t.IsZero() && !t.After(now); t = s.Next(t) {
		if !slot.IsZero() {
			skipped++
		}
		slot = t
	}
	return slot, skipped
}

// maxCountedSkips bounds the work of counting skipped slots after a long outage.
const maxCountedSkips = 1000

// JobName is the deterministic name of the backup Job for one slot: "<cluster>-<slot in Unix
// minutes>", as the Kubernetes CronJob controller names its Jobs. A retry, a second reconcile or a
// restarted operator computes the same name, so a slot can never get two Jobs.
func JobName(cluster string, slot time.Time) string {
	return fmt.Sprintf("%s-%d", cluster, slot.Unix()/60)
}
