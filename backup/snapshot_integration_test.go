package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
)

// These tests run the backup against real processes: etcd and versitygw (see backuptest).

func requireBinary(t testing.TB, env, name string) string {
	t.Helper()
	return backuptest.RequireBinary(t, env, name)
}

func startEtcd(t *testing.T, etcd, dataDir, name string) string {
	t.Helper()
	return backuptest.StartEtcd(t, etcd, dataDir, name)
}

type s3Server struct {
	backuptest.S3Gateway
}

func startS3(t testing.TB) s3Server {
	t.Helper()
	return s3Server{backuptest.StartS3(t)}
}

func (s s3Server) config() S3 {
	return S3{Endpoint: s.Endpoint, Bucket: s.Bucket, Region: s.Region, Insecure: true, AccessKey: s.AccessKey, SecretKey: s.SecretKey}
}

func (s s3Server) store(t testing.TB) Store {
	t.Helper()
	st, err := NewS3Store(s.config())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// stores are the two kinds of destination: a real S3 gateway, and a directory as a mounted
// PersistentVolumeClaim would be.
func stores(t *testing.T) map[string]func(t *testing.T) Store {
	return map[string]func(t *testing.T) Store{
		"s3":  func(t *testing.T) Store { return startS3(t).store(t) },
		"pvc": func(t *testing.T) Store { return NewDirStore(t.TempDir(), "backups") },
	}
}

// read returns an object's content, failing the test when it cannot be read.
func read(t *testing.T, store Store, key string) []byte {
	t.Helper()
	obj, err := store.Open(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	data, err := io.ReadAll(obj)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return data
}

func TestBackupUploadsARestorableSnapshotAndNeverOverwrites(t *testing.T) {
	etcd := requireBinary(t, "KVC_ETCD_DIR", "etcd")
	etcdutl := requireBinary(t, "KVC_ETCD_DIR", "etcdutl")
	for kind, newStore := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			store := newStore(t)
			endpoint := startEtcd(t, etcd, t.TempDir(), "source")
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			want := map[string]string{}
			for i := range 200 {
				k, v := fmt.Sprintf("key/%03d", i), strings.Repeat(fmt.Sprint(i), 100)
				if _, err := cli.Put(ctx, k, v); err != nil {
					t.Fatal(err)
				}
				want[k] = v
			}

			const key = "prod/kv/kv-29933460.db"
			clock := func() time.Time { return time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC) }
			res, err := Take(ctx, Etcd{Endpoints: []string{"http://127.0.0.1:1", endpoint}}, store, key, Retention{}, clock)
			if err != nil {
				t.Fatalf("backup: %v", err)
			}
			if res.Member != endpoint || res.Revision < 201 || res.EtcdVersion == "" || res.Size < 4096 || res.Location != store.URI(key) {
				t.Errorf("result = %+v", res)
			}

			// The object's sha256 is what the backup reported, and the metadata beside it says the same.
			data := read(t, store, key)
			if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != res.SHA256 || int64(len(data)) != res.Size {
				t.Errorf("stored object sha256 %x size %d, reported %s size %d", sum, len(data), res.SHA256, res.Size)
			}
			var meta Result
			if err := json.Unmarshal(read(t, store, key+MetadataSuffix), &meta); err != nil {
				t.Fatal(err)
			}
			if meta.SHA256 != res.SHA256 || meta.Revision != res.Revision || meta.Location != res.Location {
				t.Errorf("metadata = %+v, result = %+v", meta, res)
			}

			// The restore path members use: fetch (verified against the metadata's sha256), then apply
			// with etcdutl (which also checks etcd's own hash trailer).
			work := t.TempDir()
			restored := filepath.Join(work, "data")
			snapFile := filepath.Join(work, "restore.db")
			if _, err := Fetch(ctx, store, key, strings.Repeat("0", 64), restored, snapFile); err == nil || !strings.Contains(err.Error(), "refusing to restore") {
				t.Errorf("a snapshot with the wrong checksum was accepted: %v", err)
			}
			if skipped, err := Fetch(ctx, store, key, "", restored, snapFile); err != nil || skipped {
				t.Fatalf("fetch: skipped %v, %v", skipped, err)
			}
			peer := fmt.Sprintf("http://127.0.0.1:%d", backuptest.FreePort(t))
			member := Member{Name: "restored", InitialCluster: "restored=" + peer, Token: "t", PeerURL: peer}
			if skipped, err := Apply(ctx, etcdutl, snapFile, restored, member); err != nil || skipped {
				t.Fatalf("apply: skipped %v, %v", skipped, err)
			}
			if skipped, err := Fetch(ctx, store, key, "", restored, snapFile); err != nil || !skipped {
				t.Errorf("a member with data must not fetch again: skipped %v, %v", skipped, err)
			}
			if skipped, err := Apply(ctx, etcdutl, snapFile, restored, member); err != nil || !skipped {
				t.Errorf("a member with data must not restore again: skipped %v, %v", skipped, err)
			}
			restoredEndpoint := startEtcd(t, etcd, restored, "restored")
			rcli, err := clientv3.New(clientv3.Config{Endpoints: []string{restoredEndpoint}, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer rcli.Close()
			got, err := rcli.Get(ctx, "key/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Kvs) != len(want) {
				t.Fatalf("restored %d keys, want %d", len(got.Kvs), len(want))
			}
			for _, kv := range got.Kvs {
				if want[string(kv.Key)] != string(kv.Value) {
					t.Errorf("restored %s = %.20q…", kv.Key, kv.Value)
				}
			}

			// A second backup to the same object is refused and leaves the first one intact.
			if _, err = Take(ctx, Etcd{Endpoints: []string{endpoint}}, store, key, Retention{}, clock); !errors.Is(err, ErrObjectExists) {
				t.Fatalf("second backup to the same key: %v, want ErrObjectExists", err)
			}
			if again := read(t, store, key); sha256.Sum256(again) != sha256.Sum256(data) {
				t.Error("the refused backup changed the existing object")
			}
		})
	}
}

func TestBackupErrorsSayWhatIsWrong(t *testing.T) {
	etcd := requireBinary(t, "KVC_ETCD_DIR", "etcd")
	ctx := context.Background()
	s3 := startS3(t)
	endpoint := startEtcd(t, etcd, t.TempDir(), "errs")
	clock := time.Now

	bad := s3.config()
	bad.SecretKey = "not-the-secret"
	badStore, _ := NewS3Store(bad)
	if _, err := Take(ctx, Etcd{Endpoints: []string{endpoint}}, badStore, "kv/wrong-secret.db", Retention{}, clock); err == nil || !strings.Contains(err.Error(), "refused the credentials") {
		t.Errorf("wrong secret: %v", err)
	}
	noBucket := s3.config()
	noBucket.Bucket = "missing"
	noBucketStore, _ := NewS3Store(noBucket)
	if _, err := Take(ctx, Etcd{Endpoints: []string{endpoint}}, noBucketStore, "kv/x.db", Retention{}, clock); err == nil || !strings.Contains(err.Error(), `bucket "missing" does not exist`) {
		t.Errorf("missing bucket: %v", err)
	}
	// A backup keeps asking for a member until its time is up (TestABackupWaitsForMembersItCannotReachYet).
	soon, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := Take(soon, Etcd{Endpoints: []string{"http://127.0.0.1:1"}}, s3.store(t), "kv/y.db", Retention{}, clock); err == nil || !strings.Contains(err.Error(), "no etcd member answered") {
		t.Errorf("no member: %v", err)
	}
	unmounted := NewDirStore(filepath.Join(t.TempDir(), "not-mounted"), "backups")
	if _, err := Take(ctx, Etcd{Endpoints: []string{endpoint}}, unmounted, "kv/z.db", Retention{}, clock); err == nil || !strings.Contains(err.Error(), "not mounted") {
		t.Errorf("unmounted volume: %v", err)
	}
}

func TestRetentionPrunesOnlyOldScheduledSnapshots(t *testing.T) {
	etcd := requireBinary(t, "KVC_ETCD_DIR", "etcd")
	for kind, newStore := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			store := newStore(t)
			endpoint := startEtcd(t, etcd, t.TempDir(), "retention")
			untouchable := []string{"prod/kv/kv-final.db", "prod/kv/kvx-1.db", "prod/kv/notes.txt", "prod/other/kv-1.db"}
			for _, key := range untouchable {
				if err := store.PutSmall(ctx, key, []byte("x")); err != nil {
					t.Fatal(err)
				}
			}
			keep2 := Retention{KeepLast: 2, Cluster: "kv"}
			for i := 1; i <= 4; i++ {
				res, err := Take(ctx, Etcd{Endpoints: []string{endpoint}}, store, fmt.Sprintf("prod/kv/kv-%d.db", i), keep2, time.Now)
				if err != nil {
					t.Fatalf("backup %d: %v", i, err)
				}
				if i >= 3 && (len(res.Pruned) != 1 || res.Pruned[0] != fmt.Sprintf("prod/kv/kv-%d.db", i-2)) {
					t.Errorf("backup %d pruned %v, want only kv-%d.db", i, res.Pruned, i-2)
				}
			}
			want := append([]string{"prod/kv/kv-3.db", "prod/kv/kv-3.db.meta.json", "prod/kv/kv-4.db", "prod/kv/kv-4.db.meta.json"}, untouchable...)
			if got := listKeys(t, store); strings.Join(got, " ") != strings.Join(sorted(want), " ") {
				t.Errorf("store after keepLast=2:\n got %v\nwant %v", got, sorted(want))
			}

			// An age limit deletes older snapshots too, but never the newest.
			pruned, err := Prune(ctx, store, "prod/kv/kv-4.db", Retention{KeepLast: 10, MaxAge: time.Hour, Cluster: "kv"}, time.Now().Add(3*time.Hour))
			if err != nil || len(pruned) != 1 || pruned[0] != "prod/kv/kv-3.db" {
				t.Errorf("maxAge pruned %v (%v), want only kv-3.db", pruned, err)
			}
			if got := listKeys(t, store); !slices.Contains(got, "prod/kv/kv-4.db") {
				t.Errorf("the newest snapshot was pruned: %v", got)
			}
		})
	}
}

// listKeys lists every object in the test stores' two directories.
func listKeys(t *testing.T, store Store) []string {
	t.Helper()
	var keys []string
	for _, dir := range []string{"prod/kv/", "prod/other/"} {
		objs, err := store.List(context.Background(), dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			keys = append(keys, o.Key)
		}
	}
	return sorted(keys)
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// TestNextBackupRemovesWhatKilledBackupsLeft: a backup killed mid-stream leaves a temporary file
// or an incomplete multipart upload (billed, never listed). The next backup into the same
// directory removes it once it is older than any backup may run, and never earlier: until then
// it may belong to a backup still running.
func TestNextBackupRemovesWhatKilledBackupsLeft(t *testing.T) {
	etcd := requireBinary(t, "KVC_ETCD_DIR", "etcd")
	for kind, newStore := range storesWithLeftovers() {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			store, leftovers := newStore(t, "prod/kv/")
			endpoint := startEtcd(t, etcd, t.TempDir(), "killed")
			killed := stallPut(t, store, "prod/kv/kv-1.db")
			elsewhere := stallPut(t, store, "prod/kv/deeper/kv-1.db") // another directory: none of its business
			if got := leftovers(); len(got) != 1 {
				t.Fatalf("a stalled write leaves %v, want one partial object", got)
			}

			res, err := Take(ctx, Etcd{Endpoints: []string{endpoint}}, store, "prod/kv/kv-2.db", Retention{}, time.Now)
			if err != nil {
				t.Fatalf("backup: %v", err)
			}
			if got := leftovers(); len(got) != 1 || len(res.RemovedPartial) != 0 {
				t.Errorf("a backup removed %v, a partial write younger than a backup may run: left %v", res.RemovedPartial, got)
			}

			aDayLater := func() time.Time { return time.Now().Add(24*time.Hour + time.Minute) }
			res, err = Take(ctx, Etcd{Endpoints: []string{endpoint}}, store, "prod/kv/kv-3.db", Retention{}, aDayLater)
			if err != nil {
				t.Fatalf("backup a day later: %v", err)
			}
			if got := leftovers(); len(got) != 0 {
				t.Errorf("a backup a day later left the partial writes %v", got)
			}
			if !slices.Equal(res.RemovedPartial, []string{"prod/kv/kv-1.db"}) || len(res.Warnings) != 0 {
				t.Errorf("the backup reports removedPartial %v (warnings %v), want [prod/kv/kv-1.db]", res.RemovedPartial, res.Warnings)
			}
			if err := killed(); err == nil {
				t.Error("a write whose partial object was removed succeeded")
			}
			if err := elsewhere(); err != nil {
				t.Errorf("a write in another directory failed: %v", err)
			}
			if exists, err := store.Exists(ctx, "prod/kv/kv-1.db"); err != nil || exists {
				t.Errorf("the removed partial write became an object: exists %v, %v", exists, err)
			}
		})
	}
}

// storesWithLeftovers are the stores of stores(), each with a way to see the partial writes in a
// directory that the store itself does not list.
func storesWithLeftovers() map[string]func(t *testing.T, dir string) (Store, func() []string) {
	return map[string]func(t *testing.T, dir string) (Store, func() []string){
		"s3": func(t *testing.T, dir string) (Store, func() []string) {
			s3 := startS3(t)
			return s3.store(t), func() []string {
				var keys []string
				for u := range s3.Client.ListIncompleteUploads(context.Background(), "backups", dir, false) {
					if u.Err != nil {
						t.Fatal(u.Err)
					}
					if !strings.HasSuffix(u.Key, "/") { // a deeper directory
						keys = append(keys, u.Key)
					}
				}
				return keys
			}
		},
		"pvc": func(t *testing.T, dir string) (Store, func() []string) {
			root := t.TempDir()
			return NewDirStore(root, "backups"), func() []string {
				entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(dir)))
				if err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Fatal(err)
				}
				var names []string
				for _, e := range entries {
					if name := e.Name(); !e.IsDir() && !strings.HasSuffix(name, ".db") && !strings.HasSuffix(name, MetadataSuffix) {
						names = append(names, name)
					}
				}
				return names
			}
		},
	}
}

// TestABackupWaitsForMembersItCannotReachYet: a backup Job's pod may be refused at first, until
// the NetworkPolicy engine has seen its address (a new pod; seen with kube-router). The backup
// keeps asking within its time limit rather than failing — a final backup that fails lets the
// cluster go without it (onFinalBackupFailure: Proceed).
func TestABackupWaitsForMembersItCannotReachYet(t *testing.T) {
	etcd := requireBinary(t, "KVC_ETCD_DIR", "etcd")
	endpoint := startEtcd(t, etcd, t.TempDir(), "late")
	late := fmt.Sprintf("127.0.0.1:%d", backuptest.FreePort(t))
	time.AfterFunc(7*time.Second, func() { forward(t, late, strings.TrimPrefix(endpoint, "http://")) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := NewDirStore(t.TempDir(), "backups")
	if _, err := Take(ctx, Etcd{Endpoints: []string{"http://" + late}}, store, "kv/late.db", Retention{}, time.Now); err != nil {
		t.Fatalf("a member refusing connections for 7s failed the backup: %v", err)
	}
}

// forward accepts connections on addr from now on and relays each to target.
func forward(t *testing.T, addr, target string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Error(err)
		return
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
}
