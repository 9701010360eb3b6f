package main

import (
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestOperatorPodsMustSelectTheOperatorItself: the labels every cluster's NetworkPolicy admits
// must select the operator's own pod (found by its host name); otherwise the operator refuses to
// start rather than lock itself out of every cluster it manages.
func TestOperatorPodsMustSelectTheOperatorItself(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithObjects(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: host, Namespace: "ops",
		Labels: map[string]string{"app.kubernetes.io/name": "kvcluster-operator", "pod-template-hash": "abc"}}}).Build()
	self, err := ownPod("ops", reader)
	if err != nil || self == nil || self.Name != host {
		t.Fatalf("own pod: %+v, %v", self, err)
	}

	got, err := operatorPods(self, "app.kubernetes.io/name=kvcluster-operator")
	if err != nil || got.Namespace != "ops" || got.Labels["app.kubernetes.io/name"] != "kvcluster-operator" {
		t.Errorf("matching labels: %+v, %v", got, err)
	}
	for flag, want := range map[string]string{
		"app=kvc-operator":                "does not select the operator's own pod",
		"app.kubernetes.io/name in (a,b)": "must be k=v",
	} {
		if _, err := operatorPods(self, flag); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--operator-pod-labels=%s: %v, want an error saying %q", flag, err, want)
		}
	}
	if _, err := ownPod("elsewhere", reader); err == nil {
		t.Error("a namespace without the operator's pod was accepted")
	}
	if got, err := operatorPods(nil, "app.kubernetes.io/name=kvcluster-operator"); err != nil || got.Namespace != "" {
		t.Errorf("outside a cluster: %+v, %v; want no operator pods", got, err)
	}
}

// TestJobImage: Jobs run the image given, else the operator's own container's, so that the
// Deployment's image is the one place to set it.
func TestJobImage(t *testing.T) {
	pod := func(containers ...corev1.Container) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "op-1", Namespace: "ops"}, Spec: corev1.PodSpec{Containers: containers}}
	}
	manager := corev1.Container{Name: "manager", Image: "registry.example/kvc:v2"}
	sidecar := corev1.Container{Name: "istio-proxy", Image: "istio/proxyv2"}
	tests := []struct {
		name, given string
		self        *corev1.Pod
		want, err   string
	}{
		{name: "given", given: "mirror.example/kvc:v2", self: pod(manager), want: "mirror.example/kvc:v2"},
		{name: "the manager container's", self: pod(sidecar, manager), want: "registry.example/kvc:v2"},
		{name: "the only container's, whatever its name", self: pod(corev1.Container{Name: "operator", Image: "kvc:v3"}), want: "kvc:v3"},
		{name: "outside a cluster", err: "outside a cluster, give --backup-image"},
		{name: "no manager among several", self: pod(sidecar, corev1.Container{Name: "operator", Image: "kvc:v3"}), err: `no container named "manager"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := jobImage(tt.given, tt.self)
			if got != tt.want || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
				t.Errorf("jobImage = %q, %v; want %q, an error saying %q", got, err, tt.want, tt.err)
			}
		})
	}
}
