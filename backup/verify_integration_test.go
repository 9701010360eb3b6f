package backup

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// corruptingReads is a store that returns what was written with its first byte changed, as a
// faulty disk or gateway might.
type corruptingReads struct{ Store }

func (c corruptingReads) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	obj, err := c.Store.Open(ctx, key)
	if err != nil {
		return nil, err
	}
	return &flipFirstByte{ReadCloser: obj}, nil
}

type flipFirstByte struct {
	io.ReadCloser
	done bool
}

func (f *flipFirstByte) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if n > 0 && !f.done {
		p[0] ^= 0xff
		f.done = true
	}
	return n, err
}

// TestBackupThatFailsVerificationIsNotKept: a snapshot that does not read back as written is
// useless, so the backup says so, deletes it, and the snapshots that did verify are kept.
func TestBackupThatFailsVerificationIsNotKept(t *testing.T) {
	etcd := requireBinary(t, "KVC_ETCD_DIR", "etcd")
	for kind, newStore := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			store := newStore(t)
			endpoint := startEtcd(t, etcd, t.TempDir(), "verify")
			keep1 := Retention{KeepLast: 1, Cluster: "kv"}
			if _, err := Take(ctx, Etcd{Endpoints: []string{endpoint}}, store, "prod/kv/kv-1.db", keep1, time.Now); err != nil {
				t.Fatalf("backup: %v", err)
			}

			_, err := Take(ctx, Etcd{Endpoints: []string{endpoint}}, corruptingReads{store}, "prod/kv/kv-2.db", keep1, time.Now)
			uri := store.URI("prod/kv/kv-2.db")
			for _, want := range []string{"verification failed", uri + " does not match what was written", "it was deleted"} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("a backup that reads back wrong: error %v, want one saying %q", err, want)
				}
			}
			want := []string{"prod/kv/kv-1.db", "prod/kv/kv-1.db" + MetadataSuffix}
			if got := listKeys(t, store); !slices.Equal(got, want) {
				t.Errorf("left in the store: %v, want %v", got, want)
			}

			// The next good backup prunes the first; it is not confused by the broken one.
			res, err := Take(ctx, Etcd{Endpoints: []string{endpoint}}, store, "prod/kv/kv-3.db", keep1, time.Now)
			if err != nil || fmt.Sprint(res.Pruned) != "[prod/kv/kv-1.db]" {
				t.Errorf("the next backup pruned %v (%v), want [prod/kv/kv-1.db]", res.Pruned, err)
			}
		})
	}
}
