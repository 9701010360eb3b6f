package main

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
)

func TestMetricsOptions(t *testing.T) {
	withCert := t.TempDir()
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(withCert, f), []byte("pem"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name            string
		secure          bool
		certDir         string
		wantErr, wantFS bool
	}{
		{"secure by default: HTTPS behind the API server's authentication and authorization", true, "", false, true},
		{"a certificate folder with its files", true, withCert, false, true},
		{"a certificate folder without them is refused, not replaced by a self-signed one", true, t.TempDir(), true, false},
		{"plain HTTP when asked", false, "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := metricsOptions(":8443", tt.secure, tt.certDir)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want an error: %t", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if opts.SecureServing != tt.wantFS || (opts.FilterProvider != nil) != tt.wantFS {
				t.Errorf("SecureServing %t, filter set %t; want both %t", opts.SecureServing, opts.FilterProvider != nil, tt.wantFS)
			}
			if tt.wantFS {
				c := &tls.Config{NextProtos: []string{"h2"}}
				for _, o := range opts.TLSOpts {
					o(c)
				}
				if len(c.NextProtos) != 1 || c.NextProtos[0] != "http/1.1" {
					t.Errorf("NextProtos = %v, want HTTP/1.1 only", c.NextProtos)
				}
			}
		})
	}
}
