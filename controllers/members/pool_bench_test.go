//go:build unix

package members

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
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

// BenchmarkAskingAMember is one status request to a real etcd member, on a connection dialled for
// it (no pool) or on a pooled one, plaintext and with mutual TLS (what a cluster gets by
// default): what the pool saves per request. A TLS connection dialled with the same configuration
// resumes a session; "TLS/dialled-config-of" makes the configuration again for each, with the
// sessions kept (certs.ClientConfigs, as the operator does for each look at a cluster, which
// then asks each of its members); "TLS/dialled-new-config" makes the configuration for each with
// no session kept (a full handshake), as the operator did before it kept them.
//
//	KVC_ETCD_DIR=$(e2e/localcluster/build.sh --print-dir etcd-3.7.3) go test -run '^$' -bench AskingAMember ./controllers/members/
func BenchmarkAskingAMember(b *testing.B) {
	etcd := backuptest.RequireBinary(b, "KVC_ETCD_DIR", "etcd")
	now := time.Now()
	ca, err := certs.NewCA("bench-ca", now, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	server, err := ca.Issue(certs.Server, []string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	client, err := ca.Issue(certs.Client, []string{"operator"}, now, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	files := map[string][]byte{"ca.crt": ca.CertPEM, "server.crt": server.CertPEM, "server.key": server.KeyPEM}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	config, err := certs.ClientConfig(ca.CertPEM, client.CertPEM, client.KeyPEM)
	if err != nil {
		b.Fatal(err)
	}
	plaintext := backuptest.StartEtcd(b, etcd, filepath.Join(dir, "plaintext"), "plaintext")
	// A TLS member's client URL is https only, so it is started here and found ready by asking it.
	secure := fmt.Sprintf("https://127.0.0.1:%d", backuptest.FreePort(b))
	peer := fmt.Sprintf("http://127.0.0.1:%d", backuptest.FreePort(b))
	backuptest.StartProcess(b, "etcd-tls", etcd, "--name=tls", "--data-dir="+filepath.Join(dir, "tls"),
		"--listen-client-urls="+secure, "--advertise-client-urls="+secure, "--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer, "--initial-cluster=tls="+peer, "--unsafe-no-fsync",
		"--cert-file="+filepath.Join(dir, "server.crt"), "--key-file="+filepath.Join(dir, "server.key"),
		"--trusted-ca-file="+filepath.Join(dir, "ca.crt"), "--client-cert-auth")
	ask := func(e EtcdClient, url string) error {
		return e.do(context.Background(), []string{url}, func(ctx context.Context, cli *clientv3.Client) error {
			_, err := statusOf(ctx, cli, url)
			return err
		})
	}
	backuptest.WaitFor(b, "etcd with TLS", func() bool { return ask(EtcdClient{Timeout: time.Second, TLS: config}, secure) == nil })

	for _, member := range []struct {
		name string
		url  string
		tls  *tls.Config
	}{{"plaintext", plaintext, nil}, {"TLS", secure, config}} {
		for _, pooled := range []bool{false, true} {
			name := member.name + "/dialled"
			e := EtcdClient{Timeout: 5 * time.Second, TLS: member.tls}
			if pooled {
				name = member.name + "/pooled"
				e.Pool = NewPool(time.Minute, 10)
			}
			b.Run(name, func(b *testing.B) {
				defer reportCPU(b)()
				for b.Loop() {
					if err := ask(e, member.url); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	b.Run("TLS/dialled-config-of", func(b *testing.B) {
		defer reportCPU(b)()
		var configs certs.ClientConfigs[string]
		for b.Loop() {
			config, err := configs.Of("ns/kv", ca.CertPEM, client.CertPEM, client.KeyPEM, server.CertPEM)
			if err != nil {
				b.Fatal(err)
			}
			if err := ask(EtcdClient{Timeout: 5 * time.Second, TLS: config}, secure); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TLS/dialled-new-config", func(b *testing.B) {
		defer reportCPU(b)()
		for b.Loop() {
			config, err := certs.ClientConfig(ca.CertPEM, client.CertPEM, client.KeyPEM)
			if err != nil {
				b.Fatal(err)
			}
			if err := ask(EtcdClient{Timeout: 5 * time.Second, TLS: config}, secure); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// reportCPU reports the CPU time this process (the operator's side; etcd runs in its own) spent
// per operation from now until the returned function is called: the wall time per operation is
// mostly waiting for the member.
func reportCPU(b *testing.B) func() {
	before := cpuTime(b)
	return func() {
		b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-µs/op")
	}
}

func cpuTime(b *testing.B) time.Duration {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		b.Fatal(err)
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}
