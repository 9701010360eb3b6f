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
	self := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: host, Namespace: "ops",
		Labels: map[string]string{"app.kubernetes.io/name": "kvcluster-operator", "pod-template-hash": "abc"}}}
	reader := fake.NewClientBuilder().WithObjects(self).Build()

	got, err := operatorPods("ops", "app.kubernetes.io/name=kvcluster-operator", reader)
	if err != nil || got.Namespace != "ops" || got.Labels["app.kubernetes.io/name"] != "kvcluster-operator" {
		t.Errorf("matching labels: %+v, %v", got, err)
	}
	for flag, want := range map[string]string{
		"app=kvc-operator":                "does not select the operator's own pod",
		"app.kubernetes.io/name in (a,b)": "must be k=v",
	} {
		if _, err := operatorPods("ops", flag, reader); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--operator-pod-labels=%s: %v, want an error saying %q", flag, err, want)
		}
	}
	if _, err := operatorPods("elsewhere", "app.kubernetes.io/name=kvcluster-operator", reader); err == nil {
		t.Error("a namespace without the operator's pod was accepted")
	}
}
