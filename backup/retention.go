package backup

import (
	"context"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Retention says which snapshots of scheduled backups to keep beside a new one.
type Retention struct {
	// KeepLast newest snapshots are kept (at least 1).
	KeepLast int
	// MaxAge, when set, also deletes older snapshots, never the newest.
	MaxAge time.Duration
	// Cluster is the KVCluster's name: only "<Cluster>-<slot>.db" objects, which its scheduled
	// backups write, are ever pruned — never a final backup, never anything else in the store.
	Cluster string
}

// Prune deletes, in the directory of justWritten, the scheduled snapshots (and their metadata)
// that the retention does not keep. It never deletes justWritten. It returns the keys deleted.
func Prune(ctx context.Context, store Store, justWritten string, r Retention, now time.Time) ([]string, error) {
	if r.Cluster == "" || r.KeepLast < 1 {
		return nil, nil
	}
	dir := path.Dir(justWritten) + "/"
	if dir == "./" {
		dir = ""
	}
	scheduled := regexp.MustCompile("^" + regexp.QuoteMeta(r.Cluster) + `-[0-9]+\.db$`)
	objects, err := store.List(ctx, dir)
	if err != nil {
		return nil, err
	}
	snaps := slices.DeleteFunc(objects, func(o StoredObject) bool { return !scheduled.MatchString(strings.TrimPrefix(o.Key, dir)) })
	slices.SortFunc(snaps, func(a, b StoredObject) int { // newest first; the slot in the name breaks ties
		if c := b.Modified.Compare(a.Modified); c != 0 {
			return c
		}
		return strings.Compare(b.Key, a.Key)
	})
	var deleted []string
	for i, s := range snaps {
		tooMany := i >= r.KeepLast
		tooOld := r.MaxAge > 0 && i > 0 && now.Sub(s.Modified) > r.MaxAge
		if s.Key == justWritten || !(tooMany || tooOld) {
			continue
		}
		for _, key := range []string{s.Key + MetadataSuffix, s.Key} {
			if err := store.Remove(ctx, key); err != nil {
				return deleted, err
			}
		}
		deleted = append(deleted, s.Key)
	}
	return deleted, nil
}
