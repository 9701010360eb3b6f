package controllers

import (
	"context"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

func withHTTPDeregistration(kvc *kvv1.KVCluster) *kvv1.KVCluster {
	kvc.Spec.Deregistration = &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{URL: "https://registry.example/clusters/kv"}}
	return kvc
}

func TestDeregistrationRunsAfterTheFinalBackup(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("dereg")
	kvc := h.readyCluster(withHTTPDeregistration(withBackups(newKVCluster(ns, "kv", 1), "")))
	h.deleteAndReconcile(kvc)

	final := &batchv1.Job{}
	h.get(final, ns, "kv-final")
	if err := h.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "kv-deregister"}, &batchv1.Job{}); !apierrors.IsNotFound(err) {
		t.Fatalf("deregistration started before the final backup finished: %v", err)
	}
	h.finishJob(final, true, successReport("team/"+ns+"/kv/kv-final.db"))
	h.reconcile(kvc)
	dereg := &batchv1.Job{}
	h.get(dereg, ns, "kv-deregister")
	c := dereg.Spec.Template.Spec.Containers[0]
	if c.Env[0].Value != "https://registry.example/clusters/kv" || !slices.Contains(c.Args, "--method=POST") || c.Args[0] != "http-call" {
		t.Errorf("deregistration Job container = %+v", c)
	}
	h.reconcile(kvc) // running: still there
	if h.gone(kvc) {
		t.Fatal("deleted before deregistration finished")
	}
	h.finishJob(dereg, true, "POST https://registry.example/… succeeded")
	h.reconcile(kvc)
	if !h.gone(kvc) {
		t.Fatal("still there after both deletion steps succeeded")
	}
	ev := drainEvents(h)
	if strings.Count(ev, "FinalBackupCompleted") != 1 || !strings.Contains(ev, "DeregistrationSucceeded") {
		t.Errorf("events = %q, want FinalBackupCompleted once and DeregistrationSucceeded", ev)
	}
}

func TestFailedDeregistrationFailsOpenWithAWarning(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("deregfail")
	kvc := newKVCluster(ns, "kv", 1)
	kvc.Spec.Deregistration = &kvv1.DeregistrationSpec{Job: &kvv1.JobDeregistration{Image: "registry.example/deregister:1", Args: []string{"kv"}}}
	h.readyCluster(kvc)
	if !slices.Contains(h.fresh(kvc).Finalizers, kvv1.FinalizerFinalBackup) {
		t.Fatal("a deregistration step alone needs the finalizer too")
	}
	h.deleteAndReconcile(kvc)
	dereg := &batchv1.Job{}
	h.get(dereg, ns, "kv-deregister")
	if img := dereg.Spec.Template.Spec.Containers[0].Image; img != "registry.example/deregister:1" {
		t.Errorf("image = %s", img)
	}
	h.finishJob(dereg, false, "registry answered 503 Service Unavailable")
	h.reconcileGone(kvc, "Warning DeregistrationFailed", "503") // Proceed, with the cause
}

func TestDeregistrationAdmission(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("deregadm")
	ctx := context.Background()
	tests := []struct {
		name    string
		spec    *kvv1.DeregistrationSpec
		wantErr string
	}{
		{"neither", &kvv1.DeregistrationSpec{}, "exactly one of http or job"},
		{"both", &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{URL: "https://x"}, Job: &kvv1.JobDeregistration{Image: "i"}}, "exactly one of http or job"},
		{"http without a URL", &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{}}, "exactly one of url or urlSecret"},
		{"not a URL", &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{URL: "registry.example"}}, "spec.deregistration.http.url"},
		{"ok", &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{URL: "http://registry.svc/x"}}, ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvc := newKVCluster(ns, "d"+string(rune('a'+i)), 1)
			kvc.Spec.Deregistration = tt.spec
			checkAdmission(t, h.client.Create(ctx, kvc), tt.wantErr)
		})
	}
}

// The manager's client reads from a cache that may not show a Job created a moment ago; the
// start of each deletion step must be announced all the same.
func TestDeletionStepsAreAnnouncedWhenTheCacheLags(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("lag")
	kvc := h.readyCluster(withHTTPDeregistration(withBackups(newKVCluster(ns, "kv", 1), "")))
	seen := map[string]bool{}
	direct, err := client.NewWithWatch(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	h.r.Client = interceptor.NewClient(direct, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, isJob := obj.(*batchv1.Job); isJob && !seen[key.Name] {
				if err := c.Get(ctx, key, obj, opts...); err == nil {
					seen[key.Name] = true // exists now, but the "cache" shows it only on the next read
					return apierrors.NewNotFound(batchv1.Resource("jobs"), key.Name)
				}
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			return c.List(ctx, list, indexedAsLabels(opts)...)
		},
	})
	h.deleteAndReconcile(kvc)
	h.reconcile(kvc)
	final := &batchv1.Job{}
	h.get(final, ns, "kv-final")
	h.finishJob(final, true, successReport("team/"+ns+"/kv/kv-final.db"))
	h.reconcile(kvc)
	h.reconcile(kvc)
	ev := drainEvents(h)
	for _, want := range []string{"FinalBackupStarted", "DeregistrationStarted"} {
		if strings.Count(ev, want) != 1 {
			t.Errorf("%s announced %d times, want once; events:\n%s", want, strings.Count(ev, want), ev)
		}
	}
}
