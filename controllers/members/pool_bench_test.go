package members

import (
	"context"
	"runtime"
	"testing"

	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
)

// BenchmarkAnOpenClient reports the heap an open etcd client holds once it has been asked (what
// the pool keeps for each member between requests), against a real etcd:
//
//	KVC_ETCD_DIR=$(e2e/localcluster/build.sh --print-dir etcd-3.7.3) go test -run '^$' -bench AnOpenClient ./controllers/members/
func BenchmarkAnOpenClient(b *testing.B) {
	etcd := backuptest.RequireBinary(b, "KVC_ETCD_DIR", "etcd")
	url := backuptest.StartEtcd(b, etcd, b.TempDir(), "bench")
	e := EtcdClient{}
	var releases []func(error)
	defer func() {
		for _, release := range releases {
			release(nil)
		}
	}()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for b.Loop() {
		cli, release, err := e.connect(context.Background(), []string{url})
		if err != nil {
			b.Fatal(err)
		}
		releases = append(releases, release)
		if _, err := statusOf(context.Background(), cli, url); err != nil { // on cli's own connection, as the members are asked
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(len(releases)), "heap-B/client")
}
