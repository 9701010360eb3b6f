package main

import (
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStoreCredentials: an S3 store needs static keys from the environment, or --workload-identity,
// which takes none and asks the pod's cloud identity (here an EKS Pod Identity agent on loopback
// that refuses the pod).
func TestStoreCredentials(t *testing.T) {
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusForbidden) }))
	defer agent.Close()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("pod token"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_REGION",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", agent.URL)
	t.Setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token)
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{args: nil, wantErr: "missing AWS_ACCESS_KEY_ID (or --workload-identity), AWS_SECRET_ACCESS_KEY"},
		{args: []string{"--workload-identity"}, wantErr: "workloadIdentity: no credentials from the pod's cloud identity"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("backup", flag.ContinueOnError)
			f := bindStore(fs)
			if err := fs.Parse(append([]string{"--s3-endpoint=s3:7070", "--bucket=b"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			if _, err := f.open(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("open() = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

// TestAMemberThatRestoresNothingNeedsNoCredentials: a member that joins a running cluster, or
// restarts with its data, never reaches the backup's store, so neither missing keys nor an
// unreachable identity provider keeps it from starting.
func TestAMemberThatRestoresNothingNeedsNoCredentials(t *testing.T) {
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI"} {
		t.Setenv(k, "")
	}
	for _, tc := range []struct{ name, state string }{{"joining", "existing"}, {"restarted with data", "new"}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			data := filepath.Join(dir, "data")
			if err := os.MkdirAll(filepath.Join(data, "member"), 0o700); err != nil {
				t.Fatal(err)
			}
			log := filepath.Join(dir, "termination-log")
			code := runRestoreFetch([]string{"--s3-endpoint=s3:7070", "--bucket=b", "--key=team/kv-final.db", "--data-dir=" + data,
				"--out=" + filepath.Join(dir, "snapshot.db"), "--copy-self-to=" + filepath.Join(dir, "restore"),
				"--initial-cluster-state=" + tc.state, "--termination-log=" + log})
			if code != 0 {
				msg, _ := os.ReadFile(log)
				t.Errorf("restore-fetch exited %d: %s", code, msg)
			}
		})
	}
}
