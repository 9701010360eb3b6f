package backup

import (
	"context"
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

// MaxRunTime is the longest a backup may run. What a backup leaves half-done — a temporary file, an
// incomplete multipart upload, a snapshot without metadata — is removed by a later backup once it
// is older than this; a younger one may belong to a backup still running. So a backup Job's
// activeDeadlineSeconds must never exceed it (the API caps it at 86400 seconds).
const MaxRunTime = 24 * time.Hour

// Prune deletes, in the directory of justWritten, the scheduled snapshots (and their metadata)
// that the retention does not keep. Only verified snapshots count and are kept: a backup writes
// the metadata only after reading the snapshot back, so one without metadata failed that check or
// is still being checked, and it is deleted once older than MaxRunTime. Prune never deletes
// justWritten. It returns the keys deleted.
func Prune(ctx context.Context, store Store, justWritten string, r Retention, now time.Time) ([]string, error) {
	if r.Cluster == "" || r.KeepLast < 1 {
		return nil, nil
	}
	dir := dirOf(justWritten)
	scheduled := regexp.MustCompile("^" + regexp.QuoteMeta(r.Cluster) + `-[0-9]+\.db$`)
	objects, err := store.List(ctx, dir)
	if err != nil {
		return nil, err
	}
	verified := map[string]bool{}
	for _, o := range objects {
		if snapshot, ok := strings.CutSuffix(o.Key, MetadataSuffix); ok {
			verified[snapshot] = true
		}
	}
	snaps := slices.DeleteFunc(objects, func(o StoredObject) bool { return !scheduled.MatchString(strings.TrimPrefix(o.Key, dir)) })
	slices.SortFunc(snaps, func(a, b StoredObject) int { // newest first; the slot in the name breaks ties
		if c := b.Modified.Compare(a.Modified); c != 0 {
			return c
		}
		return strings.Compare(b.Key, a.Key)
	})
	var deleted []string
	kept := 0
	for _, s := range snaps {
		var remove bool
		switch {
		case s.Key == justWritten: // verified before Prune runs, even if a listing does not show its metadata yet
			kept++
		case verified[s.Key]:
			tooMany := kept >= r.KeepLast
			tooOld := r.MaxAge > 0 && kept > 0 && now.Sub(s.Modified) > r.MaxAge
			if remove = tooMany || tooOld; !remove {
				kept++
			}
		default:
			remove = now.Sub(s.Modified) > MaxRunTime
		}
		if !remove {
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
