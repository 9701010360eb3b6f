package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// How long verdicts are kept, as controller-runtime's filter keeps them (a scraper asks every
// 15–30 s; each verdict not kept costs a request to the API server). A token the API server does
// not authenticate is not kept: the next request asks again.
const (
	authenticatedTTL = time.Minute
	allowedTTL       = 5 * time.Minute
	deniedTTL        = 30 * time.Second
	reviewTimeout    = 10 * time.Second
	// maxVerdicts bounds each cache: past it, the expired verdicts go, then all of them.
	maxVerdicts = 1024
)

// metricsAuth serves the metrics only to clients the API server authenticates (TokenReview of the
// bearer token) and authorizes to get the path (SubjectAccessReview on the non-resource URL), as
// controller-runtime's filters.WithAuthenticationAndAuthorization does: 401 without a token or
// with one the API server does not accept (that filter answers 500 to the latter), 403 when the
// user may not, 500 when the API server cannot be asked after a few tries. Only GET and HEAD are
// asked about (others: 405), so a request's method cannot grow the verdicts kept. It does without
// the k8s.io/apiserver machinery that filter brings (about 9 MB of the binary, with CEL and ANTLR,
// mapped into memory by every operator).
type metricsAuth struct {
	tokens  authenticationclient.TokenReviewInterface
	reviews authorizationclient.SubjectAccessReviewInterface
	now     func() time.Time
	// backoff is how a review is tried again when the API server does not answer it (429, 5xx,
	// no connection): five tries in about 4 s, as controller-runtime's filter does.
	backoff wait.Backoff

	mu            sync.Mutex
	authenticated map[[sha256.Size]byte]verdict[authenticationv1.UserInfo]
	allowed       map[[sha256.Size]byte]verdict[bool]
}

type verdict[T any] struct {
	value   T
	expires time.Time
}

// metricsAuthFilter is the metrics server's FilterProvider.
func metricsAuthFilter(config *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	authn, err := authenticationclient.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	authz, err := authorizationclient.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	a := newMetricsAuth(authn.TokenReviews(), authz.SubjectAccessReviews(), time.Now)
	return func(log logr.Logger, next http.Handler) (http.Handler, error) { return a.handler(log, next), nil }, nil
}

func newMetricsAuth(tokens authenticationclient.TokenReviewInterface, reviews authorizationclient.SubjectAccessReviewInterface, now func() time.Time) *metricsAuth {
	return &metricsAuth{tokens: tokens, reviews: reviews, now: now, backoff: wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5},
		authenticated: map[[sha256.Size]byte]verdict[authenticationv1.UserInfo]{}, allowed: map[[sha256.Size]byte]verdict[bool]{}}
}

func (a *metricsAuth) handler(log logr.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
			return
		}
		credentials := strings.Fields(req.Header.Get("Authorization"))
		if len(credentials) != 2 || !strings.EqualFold(credentials[0], "Bearer") {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		token := credentials[1]
		user, ok, err := a.authenticate(req.Context(), token)
		switch {
		case err != nil:
			log.Error(err, "Authentication failed")
			http.Error(w, "Authentication failed", http.StatusInternalServerError)
			return
		case !ok:
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(req.Method)
		allowed, err := a.authorize(req.Context(), user, verb, req.URL.Path)
		switch {
		case err != nil:
			log.Error(err, "Authorization failed", "user", user.Username)
			http.Error(w, "Authorization for user "+user.Username+" failed", http.StatusInternalServerError)
		case !allowed:
			log.V(4).Info("Authorization denied", "user", user.Username, "verb", verb, "path", req.URL.Path)
			http.Error(w, "Authorization denied for user "+user.Username, http.StatusForbidden)
		default:
			next.ServeHTTP(w, req)
		}
	})
}

// authenticate asks the API server who holds token, unless it answered within authenticatedTTL.
// Tokens are kept only as their digests.
func (a *metricsAuth) authenticate(ctx context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	key := sha256.Sum256([]byte(token))
	if v, ok := cached(a, a.authenticated, key); ok {
		return v, true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	var review *authenticationv1.TokenReview
	err := a.retryTransient(ctx, func() (err error) {
		review, err = a.tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return authenticationv1.UserInfo{}, false, err
	}
	if !review.Status.Authenticated {
		return authenticationv1.UserInfo{}, false, nil
	}
	keep(a, a.authenticated, key, review.Status.User, authenticatedTTL)
	return review.Status.User, true, nil
}

// authorize asks the API server whether user may verb path, unless it answered within allowedTTL
// (yes) or deniedTTL (no).
func (a *metricsAuth) authorize(ctx context.Context, user authenticationv1.UserInfo, verb, path string) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	spec := authorizationv1.SubjectAccessReviewSpec{User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb}}
	// The question itself is the key (JSON writes a map's keys in order), as its digest.
	question, err := json.Marshal(spec)
	if err != nil {
		return false, err
	}
	key := sha256.Sum256(question)
	if v, ok := cached(a, a.allowed, key); ok {
		return v, nil
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	var review *authorizationv1.SubjectAccessReview
	err = a.retryTransient(ctx, func() (err error) {
		review, err = a.reviews.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return false, err
	}
	allowed, ttl := review.Status.Allowed && !review.Status.Denied, deniedTTL
	if allowed {
		ttl = allowedTTL
	}
	keep(a, a.allowed, key, allowed, ttl)
	return allowed, nil
}

// retryTransient calls create until it succeeds, the API server refuses for good (a 4xx other
// than 429), the context ends or the backoff's tries were made.
func (a *metricsAuth) retryTransient(ctx context.Context, create func() error) error {
	return retry.OnError(a.backoff, func(err error) bool {
		var status apierrors.APIStatus
		if ctx.Err() != nil {
			return false
		}
		if errors.As(err, &status) {
			code := status.Status().Code
			return code == http.StatusTooManyRequests || code >= http.StatusInternalServerError
		}
		return true // no answer: the connection
	}, create)
}

func cached[K comparable, T any](a *metricsAuth, m map[K]verdict[T], key K) (T, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := m[key]
	if !ok || !a.now().Before(v.expires) {
		var zero T
		return zero, false
	}
	return v.value, true
}

func keep[K comparable, T any](a *metricsAuth, m map[K]verdict[T], key K, value T, ttl time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if len(m) >= maxVerdicts {
		for k, v := range m {
			if !now.Before(v.expires) {
				delete(m, k)
			}
		}
		if len(m) >= maxVerdicts {
			clear(m)
		}
	}
	m[key] = verdict[T]{value: value, expires: now.Add(ttl)}
}
