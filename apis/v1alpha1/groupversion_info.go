// Package v1alpha1 holds the kvcluster.io/v1alpha1 API: the KVCluster custom resource.
//
// +kubebuilder:object:generate=true
// +kubebuilder:ac:generate=true
// +kubebuilder:ac:output:package=../applyconfiguration
// +groupName=kvcluster.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "kvcluster.io", Version: "v1alpha1"}

	// SchemeGroupVersion is the same value under the name generated apply configurations use.
	SchemeGroupVersion = GroupVersion

	// SchemeBuilder registers this API's types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
