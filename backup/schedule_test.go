package backup

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestParseRejectsBadSchedules(t *testing.T) {
	now := at("2026-11-30T12:00:00Z")
	tests := []struct {
		expr, tz, wantErr string
	}{
		{"", "", "empty spec string"},
		{"0 0 3 * * *", "", "expected exactly 5 fields"}, // a seconds field would turn daily into hourly
		{"daily", "", "expected exactly 5 fields"},
		{"61 * * * *", "", "end of range (61) above maximum (59)"},
		{"59 23 31 2 *", "", "never fires"}, // February 31st
		{"0 0 30 2 *", "", "never fires"},
		{"TZ=0", "", "invalid schedule"}, // robfig/cron panics on this one
		{"TZ=Mars/Olympus 0 3 * * *", "", "invalid schedule"},
		{"0 3 * * *", "Mars/Olympus", "unknown time zone"},
		{"CRON_TZ=UTC 0 3 * * *", "Europe/Berlin", "both in the schedule and in the time zone field"},
		{"@every 5m", "", "@every has no fixed slots"},
		{"@fortnightly", "", "unrecognized descriptor"},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			_, err := Parse(tt.expr, tt.tz, now)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse(%q, %q) error = %v, want one containing %q", tt.expr, tt.tz, err, tt.wantErr)
			}
		})
	}
	if _, err := Parse("59 23 31 2 *", "", now); !errors.Is(err, ErrNeverFires) {
		t.Errorf("a never-firing schedule must wrap ErrNeverFires, got %v", err)
	}
}

func TestMostRecentSlot(t *testing.T) {
	tests := []struct {
		name             string
		expr, tz         string
		after, now       string
		deadline         time.Duration
		wantSlot         string // "" = none due
		wantSkipped      int
		wantNextAfterNow string
	}{
		{"every minute, none due yet", "* * * * *", "", "2026-11-30T12:00:00Z", "2026-11-30T12:00:30Z", 0, "", 0, "2026-11-30T12:01:00Z"},
		{"every minute, exactly one due", "* * * * *", "", "2026-11-30T12:00:00Z", "2026-11-30T12:01:00Z", 0, "2026-11-30T12:01:00Z", 0, "2026-11-30T12:02:00Z"},
		{"every minute, many missed: only the latest runs", "* * * * *", "", "2026-11-30T12:00:00Z", "2026-11-30T12:05:10Z", 0, "2026-11-30T12:05:00Z", 4, "2026-11-30T12:06:00Z"},
		{"hourly, one due", "0 * * * *", "", "2026-11-30T11:00:00Z", "2026-11-30T12:30:00Z", 0, "2026-11-30T12:00:00Z", 0, "2026-11-30T13:00:00Z"},
		{"@daily, one missed and one due", "@daily", "", "2026-11-28T00:00:00Z", "2026-11-30T05:00:00Z", 0, "2026-11-30T00:00:00Z", 1, "2026-12-01T00:00:00Z"},
		{"@hourly descriptor", "@hourly", "", "2026-11-30T11:00:00Z", "2026-11-30T11:59:59Z", 0, "", 0, "2026-11-30T12:00:00Z"},
		{"starting deadline: latest slot still fresh", "0 * * * *", "", "2026-11-30T00:00:00Z", "2026-11-30T03:20:00Z", 30 * time.Minute, "2026-11-30T03:00:00Z", 2, "2026-11-30T04:00:00Z"},
		{"starting deadline: latest slot too old", "0 * * * *", "", "2026-11-30T00:00:00Z", "2026-11-30T03:45:00Z", 30 * time.Minute, "", 3, "2026-11-30T04:00:00Z"},
		{"starting deadline: a year down, every minute, bounded work", "* * * * *", "", "2025-11-30T00:00:00Z", "2026-11-30T00:00:30Z", time.Minute, "2026-11-30T00:00:00Z", maxCountedSkips, "2026-11-30T00:01:00Z"},
		{"time zone: 03:00 Berlin is 02:00 UTC in winter", "0 3 * * *", "Europe/Berlin", "2026-11-29T02:00:00Z", "2026-11-30T02:00:00Z", 0, "2026-11-30T02:00:00Z", 0, "2026-12-01T02:00:00Z"},
		{"time zone in the expression", "CRON_TZ=America/New_York 0 3 * * *", "", "2026-11-29T08:00:00Z", "2026-11-30T08:00:00Z", 0, "2026-11-30T08:00:00Z", 0, "2026-12-01T08:00:00Z"},
		// 2026-03-29: Berlin springs forward at 02:00 CET to 03:00 CEST, so 02:30 does not exist.
		// Like Kubernetes CronJobs (same library), a wall-clock time that does not exist that day
		// has no slot: that day's backup is skipped, the next day's runs. Documented in the API.
		{"DST spring forward: the nonexistent 02:30 is skipped that day", "30 2 * * *", "Europe/Berlin", "2026-03-28T01:30:00Z", "2026-03-29T12:00:00Z", 0, "", 0, "2026-03-30T00:30:00Z"},
		// 2026-10-25: Berlin falls back at 03:00 CEST to 02:00 CET, so 02:30 happens twice.
		// A wall-clock time that happens twice has two slots, an hour apart (one extra backup).
		{"DST fall back: the repeated 02:30 has two slots", "30 2 * * *", "Europe/Berlin", "2026-10-24T00:30:00Z", "2026-10-25T12:00:00Z", 0, "2026-10-25T01:30:00Z", 1, "2026-10-26T01:30:00Z"},
		{"DST fall back: the first 02:30 (CEST) is a slot of its own", "30 2 * * *", "Europe/Berlin", "2026-10-24T00:30:00Z", "2026-10-25T01:00:00Z", 0, "2026-10-25T00:30:00Z", 0, "2026-10-25T01:30:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := at(tt.now)
			s, err := Parse(tt.expr, tt.tz, now)
			if err != nil {
				t.Fatal(err)
			}
			slot, skipped := s.MostRecentSlot(at(tt.after), now, tt.deadline)
			var want time.Time
			if tt.wantSlot != "" {
				want = at(tt.wantSlot)
			}
			if !slot.Equal(want) || skipped != tt.wantSkipped {
				t.Errorf("MostRecentSlot = %v, skipped %d; want %v, skipped %d", slot.UTC(), skipped, want, tt.wantSkipped)
			}
			if next := s.Next(now); !next.Equal(at(tt.wantNextAfterNow)) {
				t.Errorf("Next(now) = %v, want %s", next.UTC(), tt.wantNextAfterNow)
			}
		})
	}
}

func TestJobNameIsDeterministicAndFitsALabel(t *testing.T) {
	slot := at("2026-11-30T03:00:00Z")
	if a, b := JobName("kv", slot), JobName("kv", slot.Add(30*time.Second)); a != b {
		t.Errorf("the same slot gave two names: %s, %s", a, b)
	}
	if a, b := JobName("kv", slot), JobName("kv", slot.Add(time.Minute)); a == b {
		t.Errorf("two slots gave one name: %s", a)
	}
	if got := JobName("kv", slot); got != "kv-29933460" { // 2026-11-30T03:00Z in Unix minutes
		t.Errorf("JobName = %s", got)
	}
	longest := JobName(strings.Repeat("a", 52), at("2099-12-31T23:59:00Z"))
	if len(longest) > 63 {
		t.Errorf("%s is %d characters, more than a label value allows", longest, len(longest))
	}
}

// FuzzSchedule: no schedule string or time zone makes Parse panic (robfig/cron panics on some),
// and for every schedule it accepts, the slot arithmetic the backups rely on holds: the next slot
// is after now; the most recent slot lies in (after, now], within the starting deadline, is a
// slot of the schedule, and no slot comes between it and now.
func FuzzSchedule(f *testing.F) {
	f.Add("0 3 * * *", "", int64(0), uint16(60*24), uint32(0))
	f.Add("*/5 * * * *", "Europe/Berlin", int64(86400*180), uint16(90), uint32(600))
	f.Add("30 2 * * *", "America/New_York", int64(86400*68), uint16(60*48), uint32(3600)) // a DST change
	f.Add("CRON_TZ=Asia/Kolkata 0 0 29 2 *", "", int64(0), uint16(1), uint32(0))
	f.Add("TZ=0", "", int64(0), uint16(0), uint32(0))
	f.Add("@weekly", "", int64(0), uint16(10000), uint32(86400))
	f.Add("0 1 * * 6", "America/Santiago", int64(248*86400+10*3600), uint16(60*24), uint32(0)) // DST starts at midnight
	base := at("2026-01-01T00:00:00Z")
	f.Fuzz(func(t *testing.T, expr, tz string, offset int64, afterMinutes uint16, deadlineSeconds uint32) {
		// Within about ten years of 2026, and "after" at most a week back (the work of counting
		// slots grows with the distance).
		now := base.Add(time.Duration(offset%(10*365*86400)) * time.Second)
		after := now.Add(-time.Duration(afterMinutes%(7*24*60)) * time.Minute)
		deadline := time.Duration(deadlineSeconds%(7*86400)) * time.Second
		s, err := Parse(expr, tz, now)
		if err != nil {
			return
		}
		next := s.Next(now)
		if !next.After(now) {
			t.Fatalf("%q in %q: next slot after %s is %s", expr, tz, now, next)
		}
		noSlotSkipped(t, s, expr, tz, now, next)
		slot, skipped := s.MostRecentSlot(after, now, deadline)
		if skipped < 0 {
			t.Errorf("%q in %q: %d slots skipped", expr, tz, skipped)
		}
		if slot.IsZero() {
			return
		}
		if !slot.After(after) || slot.After(now) || deadline > 0 && slot.Before(now.Add(-deadline)) {
			t.Errorf("%q in %q: most recent slot %s outside (%s, %s] or before the deadline %s", expr, tz, slot, after, now, deadline)
		}
		if got := s.Next(slot.Add(-time.Second)); !got.Equal(slot) {
			t.Errorf("%q in %q: most recent slot %s is not a slot of the schedule (the one there is %s)", expr, tz, slot, got)
		}
		if next := s.Next(slot); !next.After(now) {
			t.Errorf("%q in %q: slot %s comes between the most recent %s and now %s", expr, tz, next, slot, now)
		}
	})
}

// noSlotSkipped checks Next against the schedule's fields alone, minute by minute, when the next
// slot is at most three days away: next is a time of the schedule, and no minute between now and
// next is one. A wall-clock minute that occurs twice (where DST ends) is not asked about: whether
// it runs once or twice is robfig/cron's choice, not a slot skipped.
func noSlotSkipped(t *testing.T, s Schedule, expr, tz string, now, next time.Time) {
	t.Helper()
	if !s.matches(next) {
		t.Errorf("%q in %q: next slot %s is not a time of the schedule", expr, tz, next)
	}
	if next.Sub(now) > 72*time.Hour {
		return
	}
	spec, ok := s.cron.(*cron.SpecSchedule)
	if !ok {
		return
	}
	twice := func(m time.Time) bool {
		wall := func(t time.Time) string { return t.In(spec.Location).Format("2006-01-02 15:04") }
		return wall(m) == wall(m.Add(-time.Hour)) || wall(m) == wall(m.Add(time.Hour))
	}
	for m := now.Truncate(time.Minute).Add(time.Minute); m.Before(next); m = m.Add(time.Minute) {
		if s.matches(m) && !twice(m) {
			t.Fatalf("%q in %q: %s is a time of the schedule between %s and the next slot %s", expr, tz, m.In(spec.Location), now, next)
		}
	}
}

// TestASlotIsOnTheScheduledDayWhereDSTStartsAtMidnight: in America/Santiago clocks go from 00:00
// to 01:00 on the first Sunday of September. robfig/cron's search steps from Saturday 23:00 over
// the missing hour into Sunday 01:00 without checking the day again, so a Saturday backup at 01:00
// would run on Sunday; the slot must be the next Saturday's.
func TestASlotIsOnTheScheduledDayWhereDSTStartsAtMidnight(t *testing.T) {
	santiago, err := time.LoadLocation("America/Santiago")
	if err != nil {
		t.Fatal(err)
	}
	saturday := time.Date(2026, 9, 5, 2, 0, 0, 0, santiago)
	s, err := Parse("0 1 * * 6", "America/Santiago", saturday)
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 9, 12, 1, 0, 0, 0, santiago)
	if got := s.Next(saturday); !got.Equal(want) {
		t.Errorf("next slot after %s: %s (a %s), want %s", saturday, got.In(santiago), got.In(santiago).Weekday(), want)
	}
	if slot, _ := s.MostRecentSlot(saturday, want.Add(-time.Minute), 0); !slot.IsZero() {
		t.Errorf("a slot at %s (a %s) between two Saturdays", slot.In(santiago), slot.In(santiago).Weekday())
	}
}

// The longest gap is what "no backup for two intervals" is measured against: a schedule of
// working days must count its weekend from any weekday, one of some days or months its pause,
// one of every minute must not be stretched.
func TestLongestGap(t *testing.T) {
	const week = 8 * 24 * time.Hour
	tests := []struct {
		name, expr string
		from       string // 2026-11-30 is a Monday, 2026-12-02 a Wednesday
		span       time.Duration
		want       time.Duration
	}{
		{"every minute", "* * * * *", "2026-11-30T12:00:30Z", week, time.Minute},
		{"every six hours", "0 */6 * * *", "2026-11-30T12:00:00Z", week, 6 * time.Hour},
		{"working days at 01:00: the weekend counts", "0 1 * * 1-5", "2026-11-30T12:00:00Z", week, 72 * time.Hour},
		{"working hours, hourly: the weekend counts", "0 9-17 * * 1-5", "2026-11-30T12:00:00Z", week, 64 * time.Hour},
		{"hourly on working days, from a Wednesday: the weekend counts", "0 * * * 1-5", "2026-12-02T12:00:00Z", week, 49 * time.Hour},
		{"weekly: the gap that crosses the span's end counts", "0 3 * * 0", "2026-11-30T12:00:00Z", time.Hour, 7 * 24 * time.Hour},
		{"days 1-7 of each month, measured on the 10th: the pause to the next month counts", "0 3 1-7 * *", "2026-12-10T12:00:00Z", 366 * 24 * time.Hour, 25 * 24 * time.Hour},
		{"daily in January to March, measured in December: the pause to next January counts", "0 3 * 1-3 *", "2026-12-10T12:00:00Z", 366 * 24 * time.Hour, 276 * 24 * time.Hour},
		{"every minute for a year: bounded, and still a minute", "* * * * *", "2026-11-30T12:00:30Z", 366 * 24 * time.Hour, time.Minute},
		{"a span that ends before the second slot sees one gap", "0 0,6 * * *", "2026-11-30T12:00:00Z", 7 * time.Hour, 6 * time.Hour},
		{"a span past the second slot sees the gap after it", "0 0,6 * * *", "2026-11-30T12:00:00Z", 19 * time.Hour, 18 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.expr, "", at(tt.from))
			if err != nil {
				t.Fatal(err)
			}
			if got := s.LongestGap(at(tt.from), tt.span); got != tt.want {
				t.Errorf("LongestGap = %s, want %s", got, tt.want)
			}
		})
	}
}
