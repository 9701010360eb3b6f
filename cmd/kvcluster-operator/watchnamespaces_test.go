package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func TestWatchNamespaces(t *testing.T) {
	for _, tc := range []struct {
		flag    string
		want    []string
		wantErr string
	}{
		{flag: "", want: nil},
		{flag: "  ", want: nil},
		{flag: "team-a", want: []string{"team-a"}},
		{flag: "team-a, team-b", want: []string{"team-a", "team-b"}},
		{flag: "team-a,,team-b", wantErr: `"" is not a namespace's name`},
		{flag: "team-a,", wantErr: `"" is not a namespace's name`},
		{flag: "Team-A", wantErr: `"Team-A" is not a namespace's name`},
		{flag: "team-a/b", wantErr: `"team-a/b" is not a namespace's name`},
		{flag: "team-a,team-a", wantErr: "namespace team-a is named twice"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			got, err := watchNamespaces(tc.flag)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("watchNamespaces(%q) = %q, %v; want an error with %q", tc.flag, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("watchNamespaces(%q) = %q, %v; want %q", tc.flag, got, err, tc.want)
			}
		})
	}
}

// TestOnlyWatchableNamespacesAreWatched: a watched namespace deleted, or re-created without the
// operator's Role, would keep the cache from syncing, so the operator from starting: it is left
// out, saying why; of one being deleted the KVClusters are still watched, to let them go.
func TestOnlyWatchableNamespacesAreWatched(t *testing.T) {
	deleting := metav1.Now()
	api := interceptor.NewClient(fake.NewClientBuilder().WithObjects(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b", DeletionTimestamp: &deleting, Finalizers: []string{"kubernetes"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-d"}}, // re-created: no Role
	).Build(), interceptor.Funcs{Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
		review := obj.(*authorizationv1.SelfSubjectAccessReview)
		attrs := review.Spec.ResourceAttributes
		review.Status.Allowed = attrs.Namespace == "team-a" && attrs.Verb == "list" && attrs.Group == "apps" && attrs.Resource == "statefulsets"
		return nil
	}})
	watchable, leaving, left, err := watchableNamespaces(api, []string{"team-a", "team-b", "team-c", "team-d"})
	if err != nil || !slices.Equal(watchable, []string{"team-a"}) || !slices.Equal(leaving, []string{"team-b"}) {
		t.Fatalf("watchableNamespaces = %v, %v, %v; want team-a, and team-b's KVClusters only (being deleted)", watchable, leaving, err)
	}
	for ns, why := range map[string]string{"team-c": "does not exist", "team-d": "Role there is missing"} {
		if !strings.Contains(left[ns], why) {
			t.Errorf("%s left out because %q, want %q", ns, left[ns], why)
		}
	}
	if _, _, left, err := watchableNamespaces(api, []string{"team-b", "team-c"}); err == nil || !strings.Contains(err.Error(), "none of the watched namespaces") ||
		!strings.Contains(left["team-b"], "kubectl patch kvc NAME -n team-b") {
		t.Errorf("no watchable namespace: %v, want an error saying how to let team-b's clusters go", err)
	}
}
