package specs

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// TestDeregistrationJob: the deregistration step is one Job, named for the cluster and labelled
// with its UID (whose it is once a foreground deletion took the KVCluster off its owners), kept by
// the guard while there is one, bounded by spec.deregistration.timeoutSeconds and never retried.
// An HTTP step runs the operator's http-call program with the URL in its environment, from the
// Secret when the user gave one, and gives up early enough to say why it failed before the Job's
// deadline kills it; a Job step runs the user's container as given.
func TestDeregistrationJob(t *testing.T) {
	labels := map[string]string{
		"app.kubernetes.io/name": "kvcluster", "app.kubernetes.io/instance": "kv", "app.kubernetes.io/managed-by": "kvcluster-operator",
		"kvcluster.io/cluster": "kv", "kvcluster.io/cluster-uid": "uid-1", "kvcluster.io/deletion-step": "deregister",
	}
	controller := "kvcluster.io/v1alpha1 KVCluster/kv uid=uid-1 controller=true blockOwnerDeletion=true"
	guard := "v1 ConfigMap/kv-guard uid=guard-1 controller=false blockOwnerDeletion=false"
	tests := []struct {
		name         string
		deregister   kvv1.DeregistrationSpec
		guard        types.UID
		wantImage    string
		wantCommand  []string
		wantArgs     []string
		wantEnv      []string
		wantDeadline int64
		wantOwners   []string
	}{
		{
			name: "HTTP to an inline URL, no guard",
			deregister: kvv1.DeregistrationSpec{TimeoutSeconds: 300,
				HTTP: &kvv1.HTTPDeregistration{URL: "https://registry.example/members/kv", Method: "DELETE", Retries: 3}},
			wantImage:    "op:1",
			wantArgs:     []string{"http-call", "--url-env=DEREGISTRATION_URL", "--method=DELETE", "--retries=3", "--timeout=265s"},
			wantEnv:      []string{"DEREGISTRATION_URL=https://registry.example/members/kv"},
			wantDeadline: 300,
			wantOwners:   []string{controller},
		},
		{
			name: "HTTP to a URL from a Secret, guarded",
			deregister: kvv1.DeregistrationSpec{TimeoutSeconds: 10,
				HTTP: &kvv1.HTTPDeregistration{Method: "POST", Retries: 0, URLSecret: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "registry"}, Key: "url"}}},
			guard:        "guard-1",
			wantImage:    "op:1",
			wantArgs:     []string{"http-call", "--url-env=DEREGISTRATION_URL", "--method=POST", "--retries=0", "--timeout=4s"},
			wantEnv:      []string{"DEREGISTRATION_URL from Secret registry key url"},
			wantDeadline: 10,
			wantOwners:   []string{controller, guard},
		},
		{
			name: "the user's own container, guarded",
			deregister: kvv1.DeregistrationSpec{TimeoutSeconds: 3600,
				Job: &kvv1.JobDeregistration{Image: "team.example/deregister:1", Command: []string{"/bin/deregister"}, Args: []string{"--cluster=kv"}}},
			guard:        "guard-1",
			wantImage:    "team.example/deregister:1",
			wantCommand:  []string{"/bin/deregister"},
			wantArgs:     []string{"--cluster=kv"},
			wantDeadline: 3600,
			wantOwners:   []string{controller, guard},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvc := cluster(3)
			kvc.Spec.Deregistration = &tt.deregister
			compareFacts(t, factsOf(t, DeregistrationJob(kvc, "op:1", tt.guard)), jobFacts{
				Name: "kv-deregister", Namespace: "prod",
				Labels: labels, PodLabels: withoutInstance(labels),
				Owners:   tt.wantOwners,
				Deadline: tt.wantDeadline, Backoff: 0,
				RestartPolicy: corev1.RestartPolicyNever, AutomountToken: false,
				Image: tt.wantImage, Command: tt.wantCommand, Args: tt.wantArgs, Env: tt.wantEnv,
				TerminationMessage: corev1.TerminationMessageReadFile,
			})
		})
	}
}
