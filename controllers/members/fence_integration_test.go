package members

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
)

// TestFencedWritesAndTheAlarmsARestoreInherits runs against a real etcd: fencing stops writes at
// a revision; a snapshot taken then carries the alarm, so a cluster restored from it reports it
// as stale (its member is gone), and disarming it lets the restored cluster take writes.
func TestFencedWritesAndTheAlarmsARestoreInherits(t *testing.T) {
	etcd := backuptest.RequireBinary(t, "KVC_ETCD_DIR", "etcd")
	etcdutl := backuptest.RequireBinary(t, "KVC_ETCD_DIR", "etcdutl")
	ctx := context.Background()
	// Pooled, as the operator asks: the same clients serve request after request.
	e := EtcdClient{Timeout: 5 * time.Second, Pool: NewPool(time.Minute, 10)}
	self := func(url string) func(Member) (string, bool) { return func(Member) (string, bool) { return url, true } }

	source := backuptest.StartEtcd(t, etcd, t.TempDir(), "source")
	cli := client(t, source)
	if _, err := cli.Put(ctx, "orders/1", "acknowledged before the fence"); err != nil {
		t.Fatal(err)
	}
	revision, err := e.FenceWrites(ctx, []string{source})
	if err != nil {
		t.Fatalf("fence: %v", err)
	}
	if revision < 2 {
		t.Errorf("fenced at revision %d, want the revision of the last write (2)", revision)
	}
	if _, err := cli.Put(ctx, "orders/2", "after the fence"); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Errorf("a put after the fence: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	c, err := e.Cluster(ctx, []string{source}, self(source))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Alarms) != 1 || c.Alarms[0].Type != "NOSPACE" || len(c.StaleAlarms()) != 0 {
		t.Errorf("alarms %+v, stale %+v; want the fence's NOSPACE alarm, of a current member", c.Alarms, c.StaleAlarms())
	}

	dir := t.TempDir()
	snapshot := filepath.Join(dir, "final.db")
	saveSnapshot(t, cli, snapshot) // as the final backup does, after the fence
	peer := fmt.Sprintf("http://127.0.0.1:%d", backuptest.FreePort(t))
	restoreDir := filepath.Join(dir, "restored")
	if out, err := exec.Command(etcdutl, "snapshot", "restore", snapshot, "--name", "restored", "--initial-cluster", "restored="+peer,
		"--initial-advertise-peer-urls", peer, "--data-dir", restoreDir).CombinedOutput(); err != nil {
		t.Fatalf("etcdutl snapshot restore: %v\n%s", err, out)
	}
	restored := backuptest.StartEtcdOn(t, etcd, restoreDir, "restored", peer)
	c, err = e.Cluster(ctx, []string{restored}, self(restored))
	if err != nil {
		t.Fatal(err)
	}
	stale := c.StaleAlarms()
	if len(stale) != 1 || stale[0].Type != "NOSPACE" {
		t.Fatalf("the restored cluster's alarms %+v, stale %+v; want the source's NOSPACE alarm as stale", c.Alarms, stale)
	}
	rcli := client(t, restored)
	if _, err := rcli.Put(ctx, "orders/3", "x"); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Errorf("the restored cluster took a write before its stale alarm was disarmed: %v", err)
	}
	if err := e.DisarmAlarm(ctx, []string{restored}, stale[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := rcli.Put(ctx, "orders/3", "x"); err != nil {
		t.Errorf("a put after disarming the stale alarm: %v", err)
	}
	got, err := rcli.Get(ctx, "orders/1")
	if err != nil || len(got.Kvs) != 1 {
		t.Errorf("the write acknowledged before the fence is not in the restored cluster: %v %v", got, err)
	}
}

func saveSnapshot(t *testing.T, cli *clientv3.Client, path string) {
	t.Helper()
	snap, err := cli.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, snap); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func client(t *testing.T, url string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
