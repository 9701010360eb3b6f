package backup

import (
	"context"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
)

// Retention says which snapshots of scheduled backups to keep beside a new one.
type Retention struct {
	// KeepLast newest snapshots are kept (at least 1).
	KeepLast int
	// MaxAge, when set, also deletes older snapshots, never the newest.
	MaxAge time.Duration
	// Cluster is the KVCluster's name: only "<Cluster>-<slot>.db" objects, which its scheduled
	// backups write, are ever pruned — never a final backup, never anything else in the bucket.
	Cluster string
}

type snapshotObject struct {
	key      string
	modified time.Time
}

// Prune deletes, in the directory of justWritten, the scheduled snapshots (and their metadata)
// that the retention does not keep. It never deletes justWritten. It returns the keys deleted.
func Prune(ctx context.Context, store *minio.Client, bucket, justWritten string, r Retention, now time.Time) ([]string, error) {
	if r.Cluster == "" || r.KeepLast < 1 {
		return nil, nil
	}
	dir := path.Dir(justWritten) + "/"
	if dir == "./" {
		dir = ""
	}
	scheduled := regexp.MustCompile("^" + regexp.QuoteMeta(r.Cluster) + `-[0-9]+\.db$`)
	var snaps []snapshotObject
	for obj := range store.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: dir}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list s3://%s/%s: %w", bucket, dir, describe(obj.Err))
		}
		if scheduled.MatchString(strings.TrimPrefix(obj.Key, dir)) {
			snaps = append(snaps, snapshotObject{obj.Key, obj.LastModified})
		}
	}
	slices.SortFunc(snaps, func(a, b snapshotObject) int { // newest first; the slot in the name breaks ties
		if c := b.modified.Compare(a.modified); c != 0 {
			return c
		}
		return strings.Compare(b.key, a.key)
	})
	var deleted []string
	for i, s := range snaps {
		tooMany := i >= r.KeepLast
		tooOld := r.MaxAge > 0 && i > 0 && now.Sub(s.modified) > r.MaxAge
		if s.key == justWritten || !(tooMany || tooOld) {
			continue
		}
		for _, key := range []string{s.key + MetadataSuffix, s.key} {
			if err := store.RemoveObject(ctx, bucket, key, minio.RemoveObjectOptions{}); err != nil && minio.ToErrorResponse(err).Code != "NoSuchKey" {
				return deleted, fmt.Errorf("delete old backup s3://%s/%s: %w", bucket, key, describe(err))
			}
		}
		deleted = append(deleted, s.key)
	}
	return deleted, nil
}
