package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
)

// silentListener accepts TCP connections and never answers on them.
func silentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = conn.Close() })
		}
	}()
	return l.Addr().String()
}

// stallingProxy passes requests to an S3 gateway, except those stall says to hold: they get no
// answer until the client gives up.
func stallingProxy(t *testing.T, gateway string, stall func(*http.Request) bool) string {
	t.Helper()
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: gateway})
	testEnded := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if stall(r) {
			select {
			case <-r.Context().Done():
			case <-testEnded:
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(testEnded) }) // before Close, which waits for the handlers
	return srv.Listener.Addr().String()
}

// The backup program's --timeout is shorter than its Job's deadline, so that it can still say why
// it failed: the termination message must tell what it was doing, not only "context deadline
// exceeded".
func TestBackupThatRunsOutOfTimeSaysWhatItWasDoing(t *testing.T) {
	etcdBin := backuptest.RequireBinary(t, "KVC_ETCD_DIR", "etcd")
	etcd := backuptest.StartEtcd(t, etcdBin, t.TempDir(), "timeout")
	s3 := backuptest.StartS3(t)
	t.Setenv("AWS_ACCESS_KEY_ID", s3.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3.SecretKey)
	silent := silentListener(t)
	const key = "prod/kv/kv-1.db"
	const object = "/backups/" + key
	uploadingStalls := stallingProxy(t, s3.Endpoint, func(r *http.Request) bool {
		// Parts and the abort after them: a store that went away mid-upload.
		return r.Method == http.MethodPut && r.URL.Query().Has("partNumber") || r.Method == http.MethodDelete
	})
	readingBackStalls := stallingProxy(t, s3.Endpoint, func(r *http.Request) bool {
		return r.Method == http.MethodGet && r.URL.Path == object
	})
	s3Flags := func(endpoint string) []string {
		return []string{"--s3-endpoint=" + endpoint, "--bucket=backups", "--insecure"}
	}

	tests := []struct {
		name      string
		endpoints string
		store     []string
		want      string
	}{
		{"etcd never answers", "http://" + silent, []string{"--dir=" + t.TempDir()},
			"gave up after 2s (its --timeout) while connecting to etcd at http://" + silent},
		{"S3 never answers", etcd, s3Flags(silent),
			"gave up after 2s (its --timeout) while checking s3://backups/" + key},
		{"S3 stalls during the upload", etcd, s3Flags(uploadingStalls),
			"gave up after 2s (its --timeout) while streaming the snapshot of member " + etcd + " to s3://backups/" + key},
		{"S3 stalls during the read-back", etcd, s3Flags(readingBackStalls),
			"gave up after 2s (its --timeout) while verifying s3://backups/" + key},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			terminationLog := filepath.Join(t.TempDir(), "termination-log")
			args := append([]string{"--endpoints=" + tt.endpoints, "--key=" + key, "--timeout=2s", "--termination-log=" + terminationLog}, tt.store...)
			exit := make(chan int, 1)
			start := time.Now()
			go func() { exit <- runBackup(args) }()
			// A Job's deadline leaves the program StopTimeout past its --timeout, no more.
			select {
			case code := <-exit:
				if code != 1 {
					t.Errorf("exit code %d, want 1", code)
				}
			case <-time.After(2*time.Second + backup.StopTimeout + 3*time.Second):
				t.Fatalf("the backup did not return %s after it started with a --timeout of 2s", time.Since(start))
			}
			message, err := os.ReadFile(terminationLog)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(message), "backup failed: "+tt.want+": ") {
				t.Errorf("termination message:\n%s\nwant it to start with:\nbackup failed: %s: ", message, tt.want)
			}
		})
	}
}

// When the Job's deadline passes, the kubelet stops the pod with SIGTERM: the program says it was
// stopped, and what it was doing.
func TestBackupStoppedBySIGTERMSaysWhatItWasDoing(t *testing.T) {
	// The test's own handler keeps SIGTERM from ending the test binary, whatever happens.
	sigterm := make(chan os.Signal, 1)
	signal.Notify(sigterm, syscall.SIGTERM)
	defer signal.Stop(sigterm)
	silent := silentListener(t)
	terminationLog := filepath.Join(t.TempDir(), "termination-log")
	exit := make(chan int, 1)
	go func() {
		exit <- runBackup([]string{"--endpoints=http://" + silent, "--key=prod/kv/kv-1.db", "--dir=" + t.TempDir(),
			"--timeout=1m", "--termination-log=" + terminationLog})
	}()
	time.Sleep(time.Second) // the program is connecting to etcd, which never answers
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exit:
		if code != 1 {
			t.Errorf("exit code %d, want 1", code)
		}
	case <-time.After(backup.StopTimeout):
		t.Fatal("the backup did not stop on SIGTERM")
	}
	message, err := os.ReadFile(terminationLog)
	if err != nil {
		t.Fatal(err)
	}
	want := "backup failed: stopped (terminated signal received) while connecting to etcd at http://" + silent + ": "
	if !strings.HasPrefix(string(message), want) {
		t.Errorf("termination message:\n%s\nwant it to start with:\n%s", message, want)
	}
}
