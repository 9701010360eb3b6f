package backup

import (
	"context"
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
