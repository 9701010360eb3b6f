package backup

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// identityProvider stands in for what a cloud gives a pod bound to a role: an STS that exchanges
// the pod's web identity token (EKS IRSA), or the EKS Pod Identity agent. Both hand out the S3
// gateway's keys to the holder of the expected token only, without the session token a cloud's
// short-lived keys come with: versitygw has no STS and refuses requests that carry one.
type identityProvider struct {
	server *httptest.Server
	// asked counts the exchanges, refused the requests without the expected token.
	asked, refused atomic.Int32
}

const podToken = "eyJhbGciOiJSUzI1NiJ9.pod-service-account-token"

func startIdentityProvider(t *testing.T, s s3Server) *identityProvider {
	p := &identityProvider{}
	expires := time.Now().Add(time.Hour).UTC()
	p.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.asked.Add(1)
		switch r.URL.Path {
		case "/sts": // AssumeRoleWithWebIdentity, as AWS STS answers it
			if err := r.ParseForm(); err != nil || r.Form.Get("Action") != "AssumeRoleWithWebIdentity" ||
				r.Form.Get("WebIdentityToken") != podToken || r.Form.Get("RoleArn") != "arn:aws:iam::123456789012:role/backups" {
				p.refused.Add(1)
				w.WriteHeader(http.StatusForbidden)
				_, _ = w.Write([]byte(`<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error></ErrorResponse>`))
				return
			}
			type credentials struct {
				AccessKeyID     string    `xml:"AccessKeyId"`
				SecretAccessKey string    `xml:"SecretAccessKey"`
				SessionToken    string    `xml:"SessionToken"`
				Expiration      time.Time `xml:"Expiration"`
			}
			var resp struct {
				XMLName     xml.Name    `xml:"https://sts.amazonaws.com/doc/2011-06-15/ AssumeRoleWithWebIdentityResponse"`
				Credentials credentials `xml:"AssumeRoleWithWebIdentityResult>Credentials"`
			}
			resp.Credentials = credentials{s.AccessKey, s.SecretKey, "", expires}
			_ = xml.NewEncoder(w).Encode(resp)
		case "/pod-identity": // the EKS Pod Identity agent
			if r.Header.Get("Authorization") != podToken {
				p.refused.Add(1)
				w.WriteHeader(http.StatusForbidden)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"AccessKeyId": s.AccessKey, "SecretAccessKey": s.SecretKey,
				"Expiration": expires})
		case "/stranger": // an agent whose keys the store refuses (AWS: AccessDenied, a role without the bucket)
			_ = json.NewEncoder(w).Encode(map[string]any{"AccessKeyId": s.AccessKey, "SecretAccessKey": "not-the-secret", "Expiration": expires})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(p.server.Close)
	return p
}

// TestWorkloadIdentityReachesTheBucketWithoutKeys: with workloadIdentity the backup program has
// no static keys; it takes short-lived ones from the pod's cloud identity as the AWS SDKs do, and
// writes and reads the bucket with them. A token the provider refuses fails at once, saying what
// to check.
func TestWorkloadIdentityReachesTheBucketWithoutKeys(t *testing.T) {
	s := startS3(t)
	p := startIdentityProvider(t, s)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(podToken), 0o600); err != nil {
		t.Fatal(err)
	}
	wrongToken := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrongToken, []byte("someone else's token"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		refused bool
		wantErr string // of the first write
	}{
		{name: "a web identity token (EKS IRSA), exchanged at AWS_ENDPOINT_URL_STS", env: map[string]string{
			"AWS_WEB_IDENTITY_TOKEN_FILE": tokenFile, "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/backups",
			"AWS_ENDPOINT_URL_STS": p.server.URL + "/sts"}},
		{name: "EKS Pod Identity", env: map[string]string{
			"AWS_CONTAINER_CREDENTIALS_FULL_URI": p.server.URL + "/pod-identity", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": tokenFile}},
		{name: "a role the store refuses", wantErr: "check that the role of spec.pods.serviceAccountName may use the bucket", env: map[string]string{
			"AWS_CONTAINER_CREDENTIALS_FULL_URI": p.server.URL + "/stranger", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": tokenFile}},
		{name: "a token the STS refuses", refused: true, env: map[string]string{
			"AWS_WEB_IDENTITY_TOKEN_FILE": wrongToken, "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/backups",
			"AWS_ENDPOINT_URL_STS": p.server.URL + "/sts"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
				"AWS_ENDPOINT_URL_STS", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
				"AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_REGION"} {
				t.Setenv(k, tc.env[k])
			}
			asked, refused := p.asked.Load(), p.refused.Load()
			cfg := s.config()
			cfg.AccessKey, cfg.SecretKey, cfg.WorkloadIdentity = "", "", true
			store, err := NewS3Store(cfg)
			if tc.refused {
				if err == nil || !strings.Contains(err.Error(), "workloadIdentity") || !strings.Contains(err.Error(), "Not authorized to perform sts:AssumeRoleWithWebIdentity") {
					t.Fatalf("NewS3Store = %v, want it refused, naming workloadIdentity and the provider's answer", err)
				}
				if got := p.refused.Load() - refused; got != 1 {
					t.Errorf("the provider refused %d requests, want 1", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			key := "team/" + strings.ReplaceAll(t.Name(), "/", "-") + ".db"
			_, _, err = store.Put(ctx, key, strings.NewReader("snapshot"))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("put = %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("put with the workload's credentials: %v", err)
			}
			if got := string(read(t, store, key)); got != "snapshot" {
				t.Errorf("read %q back", got)
			}
			if a, r := p.asked.Load()-asked, p.refused.Load()-refused; a != 1 || r != 0 {
				t.Errorf("credentials fetched %d times (%d refused), want once", a, r)
			}
		})
	}
}
