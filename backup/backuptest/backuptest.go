// Package backuptest starts the real processes that backup tests run against: etcd (KVC_ETCD_DIR
// holds etcd and etcdutl) and versitygw, an S3 gateway (KVC_VERSITYGW). `make test` builds both.
package backuptest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// RequiredEnv, set by `make test`, turns a missing binary from a skip into a failure: a plain
// `go test ./...` runs the pure tests and skips these, the suite never silently skips them.
const RequiredEnv = "KVC_REQUIRE_TEST_BINARIES"

// RequireBinary returns the path of name in the directory $env names. Without it the test is
// skipped, or fails when RequiredEnv is set.
func RequireBinary(t testing.TB, env, name string) string {
	t.Helper()
	dir := os.Getenv(env)
	if dir == "" {
		if os.Getenv(RequiredEnv) != "" {
			t.Fatalf("%s is not set: run the tests with 'make test' (it builds etcd and versitygw)", env)
		}
		t.Skipf("%s is not set: 'make test' builds %s and runs this test", env, name)
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return p
}

// handedOut holds every port FreePort returned in this process: once a listener on port 0 is
// closed the kernel may return the same port from the next one, and a test that asked for two
// ports (an etcd's client and peer) must get two.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreePort is a loopback port nothing listens on, not returned before in this process.
func FreePort(t testing.TB) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port
		}
	}
	t.Fatal("no loopback port that was not handed out already in 100 tries")
	return 0
}

// StartProcess runs bin until the test ends, and shows the end of its output if the test failed.
func StartProcess(t testing.TB, name string, bin string, args ...string) {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			t.Logf("%s log:\n%s", name, lastLines(string(out), 20))
		}
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// StartEtcd runs a one-member etcd on a data dir, with any more flags given, and returns its
// client URL.
func StartEtcd(t testing.TB, etcd, dataDir, name string, flags ...string) string {
	t.Helper()
	return StartEtcdOn(t, etcd, dataDir, name, fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)), flags...)
}

// StartEtcdOn runs a one-member etcd with the given peer URL (the one a restored data dir was
// restored for) and returns its client URL once it is ready (/readyz: unlike /health, it does not
// fail while an alarm is raised).
func StartEtcdOn(t testing.TB, etcd, dataDir, name, peer string, flags ...string) string {
	t.Helper()
	client := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	StartProcess(t, "etcd-"+name, etcd, append([]string{"--name=" + name, "--data-dir=" + dataDir,
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=" + name + "=" + peer, "--unsafe-no-fsync"}, flags...)...)
	WaitFor(t, "etcd", func() bool {
		resp, err := http.Get(client + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return client
}

// WaitFor polls ok for up to 30 seconds.
func WaitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("%s did not come up", what)
}

// S3Gateway is a running versitygw with an empty bucket.
type S3Gateway struct {
	Endpoint, AccessKey, SecretKey, Region, Bucket string
	Client                                         *minio.Client
}

// StartS3 runs versitygw on a temporary directory until the test ends, with the bucket "backups".
func StartS3(t testing.TB) S3Gateway {
	t.Helper()
	gw := RequireBinary(t, "KVC_VERSITYGW", "versitygw")
	s := S3Gateway{Endpoint: fmt.Sprintf("127.0.0.1:%d", FreePort(t)), AccessKey: "backup-test", SecretKey: "backup-test-secret",
		Region: "us-east-1", Bucket: "backups"}
	StartProcess(t, "versitygw", gw, "--port", s.Endpoint, "--access", s.AccessKey, "--secret", s.SecretKey, "--region", s.Region, "posix", t.TempDir())
	var err error
	s.Client, err = minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: s.Region, BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	WaitFor(t, "versitygw", func() bool {
		return s.Client.MakeBucket(context.Background(), s.Bucket, minio.MakeBucketOptions{Region: s.Region}) == nil
	})
	return s
}
