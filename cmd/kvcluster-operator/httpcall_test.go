package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The deregistration URL may come from a Secret and carry a token in its user info, path or
// query. Whatever happens, the program says only the method and scheme://host of it: its stdout,
// stderr (pod logs) and termination message (copied into an Event) are read by people who may
// not read the Secret.
func TestHTTPCallNeverRevealsTheURL(t *testing.T) {
	secrets := []string{"us3r", "pa55", "S3CR3T", "hooks", "token="}
	answering := func(status int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
		t.Cleanup(srv.Close)
		return srv.Listener.Addr().String()
	}
	silent := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(silent.Close)
	closed := closedAddr(t)
	redirectToClosed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://"+closed+"/hooks/S3CR3T?token=S3CR3T", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirectToClosed.Close)
	accepting, refusing := answering(http.StatusNoContent), answering(http.StatusForbidden)
	secretURL := func(host string) string { return "http://us3r:pa55@" + host + "/hooks/S3CR3T?token=S3CR3T#S3CR3T" }

	tests := []struct {
		name, url string
		args      []string
		wantExit  int
		// every string in want appears in the termination message
		want []string
	}{
		{name: "success", url: secretURL(accepting), wantExit: 0,
			want: []string{"POST http://" + accepting, "succeeded"}},
		{name: "non-2xx answer", url: secretURL(refusing), wantExit: 1,
			want: []string{"deregistration failed", "POST http://" + refusing, "403 Forbidden"}},
		{name: "connection refused", url: secretURL(closed), wantExit: 1,
			want: []string{"POST http://" + closed, "connection refused"}},
		{name: "DNS failure", url: secretURL("deregistration.invalid:8080"), wantExit: 1,
			want: []string{"POST http://deregistration.invalid:8080", "lookup deregistration.invalid"}},
		{name: "no answer in time", url: secretURL(silent.Listener.Addr().String()), args: []string{"--timeout=300ms"}, wantExit: 1,
			want: []string{"POST http://" + silent.Listener.Addr().String(), "no answer"}},
		{name: "out of time between attempts", url: secretURL(closed), args: []string{"--retries=1", "--timeout=300ms"}, wantExit: 1,
			want: []string{"POST http://" + closed, "out of time after 1 attempts", "connection refused"}},
		{name: "redirected to a dead endpoint", url: secretURL(redirectToClosed.Listener.Addr().String()), wantExit: 1,
			want: []string{"POST http://" + redirectToClosed.Listener.Addr().String(), "connection refused"}},
		{name: "unparsable URL", url: "http://us3r:pa55@127.0.0.1:1/hooks/S3CR3T%zz?token=S3CR3T", wantExit: 1,
			want: []string{"$DEREGISTRATION_URL", "not a valid URL"}},
		{name: "not HTTP", url: "ftp://us3r:pa55@127.0.0.1:1/hooks/S3CR3T?token=S3CR3T", wantExit: 1,
			want: []string{"ftp://127.0.0.1:1", "http or https"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("DEREGISTRATION_URL", tt.url)
			terminationLog := filepath.Join(t.TempDir(), "termination-log")
			var stdout, stderr bytes.Buffer
			exit := httpCall(append([]string{"--retries=0", "--termination-log=" + terminationLog}, tt.args...), &stdout, &stderr)
			message, err := os.ReadFile(terminationLog)
			if err != nil {
				t.Fatalf("no termination message: %v", err)
			}
			written := map[string]string{"stdout": stdout.String(), "stderr": stderr.String(), "termination message": string(message)}
			for where, text := range written {
				var revealed []string
				for _, secret := range secrets {
					if strings.Contains(text, secret) {
						revealed = append(revealed, secret)
					}
				}
				if len(revealed) > 0 {
					t.Errorf("%s reveals %q of the URL: %q", where, revealed, text)
				}
			}
			if exit != tt.wantExit {
				t.Errorf("exit code %d, want %d (termination message %q)", exit, tt.wantExit, message)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(message), w) {
					t.Errorf("termination message %q does not say %q", message, w)
				}
			}
		})
	}
}

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
