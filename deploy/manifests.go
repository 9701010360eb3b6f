// Package deploy holds the operator's manifests (kustomize trees in its folders). Its Go code
// reads the shipped Deployment for the programs and tests that must agree with it.
package deploy

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

//go:embed manager/manager.yaml
var managerManifest []byte

// ManagerContainer is the operator's container in its Deployment.
const ManagerContainer = "manager"

// Manager is the operator's Deployment among manifests (YAML documents; nil: the shipped
// manager/manager.yaml) and its manager container. Exactly one Deployment must have one.
func Manager(manifests []byte) (*appsv1.Deployment, *corev1.Container, error) {
	if manifests == nil {
		manifests = managerManifest
	}
	var found *appsv1.Deployment
	var manager *corev1.Container
	decoder := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	for {
		var dep appsv1.Deployment
		if err := decoder.Decode(&dep); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("manifests: %w", err)
		}
		if dep.Kind != "Deployment" {
			continue
		}
		for i, c := range dep.Spec.Template.Spec.Containers {
			if c.Name != ManagerContainer {
				continue
			}
			if found != nil {
				return nil, nil, fmt.Errorf("Deployments %s and %s both have a %s container", found.Name, dep.Name, ManagerContainer)
			}
			found, manager = &dep, &dep.Spec.Template.Spec.Containers[i]
		}
	}
	if found == nil {
		return nil, nil, fmt.Errorf("no Deployment with a %s container", ManagerContainer)
	}
	return found, manager, nil
}
