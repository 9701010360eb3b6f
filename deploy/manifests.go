// Package deploy holds the operator's manifests (kustomize trees in its folders). Its Go code
// reads the shipped Deployment for the programs and tests that must agree with it.
package deploy

import (
	"bufio"
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// Only Deployments are decoded as one: another kind's fields may not fit a Deployment's.
	reader := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifests)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("manifests: %w", err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, nil, fmt.Errorf("manifests: %w", err)
		}
		if meta.Kind != "Deployment" {
			continue
		}
		var dep appsv1.Deployment
		if err := yaml.Unmarshal(doc, &dep); err != nil {
			return nil, nil, fmt.Errorf("manifests: Deployment: %w", err)
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
