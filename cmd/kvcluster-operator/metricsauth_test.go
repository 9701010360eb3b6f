package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
)

// fakeAPIServer answers TokenReviews from its tokens and SubjectAccessReviews from its grants
// (user → the paths it may get), and counts what it was asked.
type fakeAPIServer struct {
	tokens map[string]authenticationv1.UserInfo
	grants map[string][]string
	// down is the review the API server does not answer (503); unanswered, how many times it
	// does not before it does; refused, the review it refuses for good (403: no RBAC for it).
	down, refused string
	unanswered    int
	// denied: SubjectAccessReviews also say Denied (with Allowed, from a confused authorizer).
	denied   bool
	asked    []string
	lastSpec authorizationv1.SubjectAccessReviewSpec
}

// answer is the API server's error for a review of kind, if any.
func (f *fakeAPIServer) answer(kind string) error {
	f.asked = append(f.asked, kind)
	switch {
	case f.refused == kind:
		return apierrors.NewForbidden(schema.GroupResource{Resource: strings.ToLower(kind) + "s"}, "", errors.New("RBAC"))
	case f.down == kind:
		return apierrors.NewServiceUnavailable("the API server is restarting")
	case f.unanswered > 0:
		f.unanswered--
		return errors.New("dial tcp 10.96.0.1:443: connect: connection refused")
	}
	return nil
}

type tokenReviews struct {
	authenticationclient.TokenReviewInterface
	*fakeAPIServer
}

func (f tokenReviews) Create(_ context.Context, r *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	if err := f.answer("TokenReview"); err != nil {
		return nil, err
	}
	user, ok := f.tokens[r.Spec.Token]
	return &authenticationv1.TokenReview{Status: authenticationv1.TokenReviewStatus{Authenticated: ok, User: user}}, nil
}

type accessReviews struct {
	authorizationclient.SubjectAccessReviewInterface
	*fakeAPIServer
}

func (f accessReviews) Create(_ context.Context, r *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	f.lastSpec = r.Spec
	if err := f.answer("SubjectAccessReview"); err != nil {
		return nil, err
	}
	nr := r.Spec.NonResourceAttributes
	allowed := nr != nil && slices.Contains(f.grants[r.Spec.User], nr.Verb+" "+nr.Path)
	return &authorizationv1.SubjectAccessReview{Status: authorizationv1.SubjectAccessReviewStatus{Allowed: allowed, Denied: f.denied}}, nil
}

// quickly: reviews tried again after a millisecond, not half a second.
func quickly(a *metricsAuth) *metricsAuth {
	a.backoff.Duration = time.Millisecond
	return a
}

func TestMetricsAuth(t *testing.T) {
	prometheus := authenticationv1.UserInfo{Username: "system:serviceaccount:monitoring:prometheus", UID: "u1",
		Groups: []string{"system:serviceaccounts", "system:authenticated"}, Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}}}
	stranger := authenticationv1.UserInfo{Username: "system:serviceaccount:apps:web", UID: "u2"}
	reviews := func(kinds ...string) []string { return kinds }
	five := func(kind string) []string { return []string{kind, kind, kind, kind, kind} }
	tests := []struct {
		name          string
		method        string
		header        string
		path          string
		down, refused string
		unanswered    int
		denied        bool
		wantCode      int
		wantAsked     []string
	}{
		{name: "no token", header: "", path: "/metrics", wantCode: http.StatusUnauthorized},
		{name: "another scheme", header: "Basic cHJvbTpwYXNz", path: "/metrics", wantCode: http.StatusUnauthorized},
		{name: "an empty bearer token", header: "Bearer ", path: "/metrics", wantCode: http.StatusUnauthorized},
		{name: "a token the API server does not know", header: "Bearer forged", path: "/metrics", wantCode: http.StatusUnauthorized,
			wantAsked: []string{"TokenReview"}},
		{name: "a user who may not get /metrics", header: "Bearer web-token", path: "/metrics", wantCode: http.StatusForbidden,
			wantAsked: []string{"TokenReview", "SubjectAccessReview"}},
		{name: "a user who may get /metrics", header: "Bearer prom-token", path: "/metrics", wantCode: http.StatusOK,
			wantAsked: []string{"TokenReview", "SubjectAccessReview"}},
		{name: "the scheme in any case", header: "bearer prom-token", path: "/metrics", wantCode: http.StatusOK,
			wantAsked: []string{"TokenReview", "SubjectAccessReview"}},
		{name: "the same user, another path", header: "Bearer prom-token", path: "/debug", wantCode: http.StatusForbidden,
			wantAsked: []string{"TokenReview", "SubjectAccessReview"}},
		{name: "HEAD is asked about as head, which a grant of get does not cover", method: http.MethodHead, header: "Bearer prom-token", path: "/metrics",
			wantCode: http.StatusForbidden, wantAsked: reviews("TokenReview", "SubjectAccessReview")},
		{name: "another method: refused before any review", method: http.MethodPost, header: "Bearer prom-token", path: "/metrics",
			wantCode: http.StatusMethodNotAllowed},
		{name: "a method of a megabyte: refused before any review", method: strings.Repeat("X", 1<<20), header: "Bearer prom-token", path: "/metrics",
			wantCode: http.StatusMethodNotAllowed},
		{name: "more than a token", header: "Bearer prom-token extra", path: "/metrics", wantCode: http.StatusUnauthorized},
		{name: "the API server answers no TokenReview", header: "Bearer prom-token", path: "/metrics", down: "TokenReview",
			wantCode: http.StatusInternalServerError, wantAsked: five("TokenReview")},
		{name: "the API server answers no SubjectAccessReview", header: "Bearer prom-token", path: "/metrics", down: "SubjectAccessReview",
			wantCode: http.StatusInternalServerError, wantAsked: append(reviews("TokenReview"), five("SubjectAccessReview")...)},
		{name: "the operator may not create SubjectAccessReviews: not tried again", header: "Bearer prom-token", path: "/metrics", refused: "SubjectAccessReview",
			wantCode: http.StatusInternalServerError, wantAsked: reviews("TokenReview", "SubjectAccessReview")},
		{name: "no connection twice, then answers", header: "Bearer prom-token", path: "/metrics", unanswered: 2,
			wantCode: http.StatusOK, wantAsked: reviews("TokenReview", "TokenReview", "TokenReview", "SubjectAccessReview")},
		{name: "allowed and denied at once: denied", header: "Bearer prom-token", path: "/metrics", denied: true,
			wantCode: http.StatusForbidden, wantAsked: reviews("TokenReview", "SubjectAccessReview")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &fakeAPIServer{tokens: map[string]authenticationv1.UserInfo{"prom-token": prometheus, "web-token": stranger},
				grants: map[string][]string{prometheus.Username: {"get /metrics"}}, down: tt.down, refused: tt.refused,
				unanswered: tt.unanswered, denied: tt.denied}
			a := quickly(newMetricsAuth(tokenReviews{fakeAPIServer: api}, accessReviews{fakeAPIServer: api}, time.Now))
			served := false
			h := a.handler(logr.Discard(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true }))
			req := httptest.NewRequest(cmp.Or(tt.method, http.MethodGet), tt.path, nil)
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.wantCode || served != (tt.wantCode == http.StatusOK) {
				t.Errorf("HTTP %d, served %t; want %d", rec.Code, served, tt.wantCode)
			}
			if !slices.Equal(api.asked, tt.wantAsked) {
				t.Errorf("asked the API server %q, want %q", api.asked, tt.wantAsked)
			}
			if slices.Contains(api.asked, "SubjectAccessReview") && tt.header == "Bearer prom-token" {
				s := api.lastSpec
				if s.User != prometheus.Username || s.UID != "u1" || !slices.Equal(s.Groups, prometheus.Groups) ||
					!slices.Equal(s.Extra["authentication.kubernetes.io/pod-name"], authorizationv1.ExtraValue{"prometheus-0"}) {
					t.Errorf("SubjectAccessReview for %+v, want the user the TokenReview named, with its groups and extra", s)
				}
			}
		})
	}
}

// A scraper asks every 15–30 s: the API server is asked again only once a verdict is old (the
// token's after a minute, a yes after five, a no after 30 s).
func TestMetricsAuthKeepsVerdictsForAWhile(t *testing.T) {
	prometheus := authenticationv1.UserInfo{Username: "prometheus"}
	api := &fakeAPIServer{tokens: map[string]authenticationv1.UserInfo{"prom-token": prometheus, "web-token": {Username: "web"}},
		grants: map[string][]string{"prometheus": {"get /metrics"}}}
	now := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	a := newMetricsAuth(tokenReviews{fakeAPIServer: api}, accessReviews{fakeAPIServer: api}, func() time.Time { return now })
	h := a.handler(logr.Discard(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	scrape := func(token string) int {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	steps := []struct {
		after     time.Duration
		token     string
		wantCode  int
		wantAsked []string
	}{
		{0, "prom-token", http.StatusOK, []string{"TokenReview", "SubjectAccessReview"}},
		{30 * time.Second, "prom-token", http.StatusOK, nil},
		{31 * time.Second, "prom-token", http.StatusOK, []string{"TokenReview"}}, // the token's verdict is a minute old
		{0, "web-token", http.StatusForbidden, []string{"TokenReview", "SubjectAccessReview"}},
		{29 * time.Second, "web-token", http.StatusForbidden, nil},
		{time.Second, "web-token", http.StatusForbidden, []string{"SubjectAccessReview"}}, // the no is 30 s old
		{208 * time.Second, "prom-token", http.StatusOK, []string{"TokenReview"}},         // the yes is 4m59s old
		{time.Second, "prom-token", http.StatusOK, []string{"SubjectAccessReview"}},       // the yes is 5 minutes old
	}
	for i, s := range steps {
		now = now.Add(s.after)
		api.asked = nil
		if code := scrape(s.token); code != s.wantCode || !slices.Equal(api.asked, s.wantAsked) {
			t.Errorf("step %d (%s later, %s): HTTP %d, asked %q; want %d, asked %q", i, s.after, s.token, code, api.asked, s.wantCode, s.wantAsked)
		}
	}
}

// Verdicts of many tokens (a scraper whose token rotates, or someone trying tokens) are bounded.
func TestMetricsAuthBoundsItsVerdicts(t *testing.T) {
	api := &fakeAPIServer{tokens: map[string]authenticationv1.UserInfo{}, grants: map[string][]string{}}
	a := newMetricsAuth(tokenReviews{fakeAPIServer: api}, accessReviews{fakeAPIServer: api}, time.Now)
	h := a.handler(logr.Discard(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i := range maxVerdicts + 10 {
		token := fmt.Sprintf("token-%d", i)
		api.tokens[token] = authenticationv1.UserInfo{Username: fmt.Sprintf("user-%d", i)}
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(a.authenticated) > maxVerdicts || len(a.allowed) > maxVerdicts || len(a.authenticated) == 0 {
		t.Errorf("%d tokens' and %d questions' verdicts kept, want at most %d", len(a.authenticated), len(a.allowed), maxVerdicts)
	}
}
