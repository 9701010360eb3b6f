package backup

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRetentionKeepsOnlyVerifiedSnapshots prunes a directory of snapshots of given ages. A
// snapshot counts as verified when its metadata exists: the backup writes it only after reading
// the object back, so a snapshot without one failed that check, or is still being checked.
func TestRetentionKeepsOnlyVerifiedSnapshots(t *testing.T) {
	type snapshot struct {
		name     string
		age      time.Duration
		verified bool
	}
	h := time.Hour
	tests := []struct {
		name        string
		snapshots   []snapshot // the last one is the backup just written
		retention   Retention
		wantDeleted []string
	}{
		{
			name:        "a broken snapshot does not count toward keepLast",
			snapshots:   []snapshot{{"kv-1.db", 3 * h, true}, {"kv-2.db", 2 * h, false}, {"kv-3.db", 0, true}},
			retention:   Retention{KeepLast: 2, Cluster: "kv"},
			wantDeleted: nil,
		},
		{
			name:        "keepLast keeps the newest verified snapshots, skipping broken ones",
			snapshots:   []snapshot{{"kv-1.db", 5 * h, true}, {"kv-2.db", 4 * h, true}, {"kv-3.db", 3 * h, false}, {"kv-4.db", 2 * h, false}, {"kv-5.db", 0, true}},
			retention:   Retention{KeepLast: 2, Cluster: "kv"},
			wantDeleted: []string{"kv-1.db"},
		},
		{
			name:        "a snapshot without metadata may still be being verified: kept for a day",
			snapshots:   []snapshot{{"kv-1.db", 23 * h, false}, {"kv-2.db", 0, true}},
			retention:   Retention{KeepLast: 1, Cluster: "kv"},
			wantDeleted: nil,
		},
		{
			name:        "a snapshot without metadata older than a day is removed",
			snapshots:   []snapshot{{"kv-1.db", 25 * h, false}, {"kv-2.db", 0, true}},
			retention:   Retention{KeepLast: 7, Cluster: "kv"},
			wantDeleted: []string{"kv-1.db"},
		},
		{
			name:        "maxAge deletes older verified snapshots, not broken ones younger than a day",
			snapshots:   []snapshot{{"kv-1.db", 50 * h, true}, {"kv-2.db", 30 * h, true}, {"kv-3.db", 20 * h, false}, {"kv-4.db", 0, true}},
			retention:   Retention{KeepLast: 7, MaxAge: 24 * h, Cluster: "kv"},
			wantDeleted: []string{"kv-1.db", "kv-2.db"},
		},
		{
			name:        "the snapshot just written is never deleted, however old it looks",
			snapshots:   []snapshot{{"kv-2.db", 0, true}, {"kv-1.db", 48 * h, true}},
			retention:   Retention{KeepLast: 1, MaxAge: time.Minute, Cluster: "kv"},
			wantDeleted: nil,
		},
		{
			name:        "no cluster, no pruning",
			snapshots:   []snapshot{{"kv-1.db", 48 * h, false}, {"kv-2.db", 30 * h, true}, {"kv-3.db", 0, true}},
			retention:   Retention{KeepLast: 1},
			wantDeleted: nil,
		},
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			d := NewDirStore(t.TempDir(), "backups").(*dirStore)
			var want []string
			for _, s := range tt.snapshots {
				key := "prod/kv/" + s.name
				keys := []string{key}
				if s.verified {
					keys = append(keys, key+MetadataSuffix)
				}
				for _, k := range keys {
					if err := d.PutSmall(ctx, k, []byte("x")); err != nil {
						t.Fatal(err)
					}
					if err := os.Chtimes(d.path(k), now.Add(-s.age), now.Add(-s.age)); err != nil {
						t.Fatal(err)
					}
				}
				if !slices.Contains(tt.wantDeleted, s.name) {
					want = append(want, keys...)
				}
			}
			justWritten := "prod/kv/" + tt.snapshots[len(tt.snapshots)-1].name
			deleted, err := Prune(ctx, d, justWritten, tt.retention, now)
			if err != nil {
				t.Fatal(err)
			}
			var gotDeleted []string
			for _, k := range deleted {
				gotDeleted = append(gotDeleted, strings.TrimPrefix(k, "prod/kv/"))
			}
			slices.Sort(gotDeleted)
			if !slices.Equal(gotDeleted, tt.wantDeleted) {
				t.Errorf("deleted %v, want %v", gotDeleted, tt.wantDeleted)
			}
			if got := listKeys(t, d); !slices.Equal(got, sorted(want)) {
				t.Errorf("left in the store:\n got %v\nwant %v", got, sorted(want))
			}
		})
	}
}

// FuzzRetention prunes directories of scheduled snapshots (verified or not), final and
// pre-upgrade backups, other clusters' snapshots and stray objects, of any ages, and checks what
// a backup user relies on: nothing but this cluster's scheduled snapshots is ever deleted; never
// the one just written, nor the newest verified one, nor one of the keepLast newest verified
// that is within maxAge; an unverified one only after MaxRunTime; metadata only with its
// snapshot. And what it does not keep, it deletes.
func FuzzRetention(f *testing.F) {
	f.Add([]byte{0, 1, 3, 1, 0, 2, 2, 0, 0, 3, 0, 1}, uint8(2), uint8(0))
	f.Add([]byte{0, 1, 50, 1, 0, 2, 30, 1, 1, 3, 20, 0, 2, 4, 80, 1, 3, 5, 90, 1, 0, 6, 0, 1}, uint8(7), uint8(24))
	f.Add([]byte{0, 9, 0, 1, 0, 1, 48, 1}, uint8(1), uint8(1))
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, layout []byte, keepLast, maxAgeHours uint8) {
		if len(layout) < 4 || len(layout) > 4*40 {
			return
		}
		ctx := context.Background()
		d := NewDirStore(t.TempDir(), "backups").(*dirStore)
		const dir = "prod/kv/"
		type object struct {
			age                 time.Duration
			verified, scheduled bool
		}
		objects := map[string]object{}
		var justWritten string
		for i := 0; i+3 < len(layout); i += 4 { // kind, number, age in hours, verified
			kind, n, age, verified := layout[i]%5, int(layout[i+1]), time.Duration(layout[i+2])*time.Hour, layout[i+3]%2 == 1
			name := [...]string{
				fmt.Sprintf("kv-%d.db", 29936000+n),                // a scheduled snapshot of this cluster
				fmt.Sprintf("kv-final-2026113%dT120000Z.db", n%10), // a final backup
				fmt.Sprintf("kv-preupgrade-%d.db", n),              // a pre-upgrade backup
				fmt.Sprintf("kv-1-%d.db", 29936000+n),              // cluster kv-1's, were it here
				fmt.Sprintf("notes-%d.txt", n),                     // something else
			}[kind]
			objects[name] = object{age: age, verified: verified, scheduled: kind == 0}
			if kind == 0 {
				justWritten = dir + name // the last scheduled one listed was just written (and verified)
			}
		}
		if justWritten == "" {
			return
		}
		o := objects[strings.TrimPrefix(justWritten, dir)]
		o.verified = true
		objects[strings.TrimPrefix(justWritten, dir)] = o
		for name, o := range objects {
			keys := []string{dir + name}
			if o.verified {
				keys = append(keys, dir+name+MetadataSuffix)
			}
			for _, k := range keys {
				if err := d.PutSmall(ctx, k, []byte("x")); err != nil {
					t.Fatal(err)
				}
				if err := os.Chtimes(d.path(k), now.Add(-o.age), now.Add(-o.age)); err != nil {
					t.Fatal(err)
				}
			}
		}
		r := Retention{KeepLast: int(keepLast%10) + 1, MaxAge: time.Duration(maxAgeHours) * time.Hour, Cluster: "kv"}
		deleted, err := Prune(ctx, d, justWritten, r, now)
		if err != nil {
			t.Fatal(err)
		}
		left := map[string]bool{}
		for _, k := range listKeys(t, d) {
			left[k] = true
		}
		// The verified scheduled snapshots, newest first (the slot in the name breaks ties).
		var verified []string
		for name, o := range objects {
			if o.scheduled && o.verified {
				verified = append(verified, name)
			}
		}
		slices.SortFunc(verified, func(a, b string) int {
			if c := objects[a].age - objects[b].age; c != 0 {
				return int(c / time.Hour)
			}
			return strings.Compare(b, a)
		})
		for name, o := range objects {
			key := dir + name
			gone := !left[key]
			switch {
			case gone && !o.scheduled:
				t.Errorf("deleted %s, which is not a scheduled snapshot of this cluster (deleted %v)", name, deleted)
			case gone && key == justWritten:
				t.Errorf("deleted %s, the snapshot just written", name)
			case gone && !o.verified && o.age <= MaxRunTime:
				t.Errorf("deleted %s, unverified but younger than %s: it may still be being verified", name, MaxRunTime)
			case gone && o.verified && len(verified) > 0 && verified[0] == name:
				t.Errorf("deleted %s, the newest verified snapshot", name)
			case gone && o.verified && slices.Index(verified, name) < r.KeepLast && (r.MaxAge == 0 || o.age <= r.MaxAge):
				t.Errorf("deleted %s, one of the %d newest verified (%v) and within maxAge %s", name, r.KeepLast, verified, r.MaxAge)
			// And what retention is for: what it does not keep goes.
			case !gone && o.scheduled && key != justWritten && !o.verified && o.age > MaxRunTime:
				t.Errorf("kept %s, unverified and older than %s", name, MaxRunTime)
			case !gone && o.scheduled && key != justWritten && o.verified &&
				(slices.Index(verified, name) >= r.KeepLast || r.MaxAge > 0 && slices.Index(verified, name) > 0 && o.age > r.MaxAge):
				t.Errorf("kept %s beyond keepLast %d (%v) or maxAge %s", name, r.KeepLast, verified, r.MaxAge)
			}
			if o.verified && left[key+MetadataSuffix] != left[key] {
				t.Errorf("%s is there: %t, its metadata: %t", name, left[key], left[key+MetadataSuffix])
			}
		}
	})
}
