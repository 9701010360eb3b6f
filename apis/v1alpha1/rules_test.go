package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// crdRules evaluates the CRD's validation rules as the API server does, outside of it: for the
// objects an API server cannot be given any more, those an earlier release admitted.
func crdRules(t *testing.T) func(obj, old *kvv1.KVCluster) field.ErrorList {
	t.Helper()
	data, err := os.ReadFile("../../deploy/crd/kvcluster.io_kvclusters.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	var props apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, &props, nil); err != nil {
		t.Fatal(err)
	}
	schema, err := structuralschema.NewStructural(&props)
	if err != nil {
		t.Fatal(err)
	}
	validator := cel.NewValidator(schema, true, celconfig.PerCallLimit)
	unstructured := func(k *kvv1.KVCluster) any {
		if k == nil {
			return nil
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(k)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	return func(obj, old *kvv1.KVCluster) field.ErrorList {
		errs, _ := validator.Validate(context.Background(), field.NewPath(""), schema, unstructured(obj), unstructured(old), celconfig.RuntimeCELCostBudget)
		return errs
	}
}

// TestAQuotaAnEarlierReleaseAdmitted: a backend quota larger than the volume holds beside its WAL
// is refused, except that a cluster an earlier release admitted with one (up to 80% of the volume)
// can still be changed in other ways; changing the quota or the size makes it count again.
func TestAQuotaAnEarlierReleaseAdmitted(t *testing.T) {
	rules := crdRules(t)
	cluster := func(quota, size string) *kvv1.KVCluster {
		k := &kvv1.KVCluster{}
		k.APIVersion, k.Kind, k.Name = "kvcluster.io/v1alpha1", "KVCluster", "kv"
		k.Spec.Version, k.Spec.Partitions = "3.7.3", 3
		q := resource.MustParse(quota)
		k.Spec.Space.BackendQuota = &q
		if size != "" {
			k.Spec.Storage.Size = resource.MustParse(size)
		}
		return k
	}
	earlier := cluster("800Mi", "1Gi")
	type ruleCase struct {
		name     string
		obj, old *kvv1.KVCluster
		wantErr  bool
	}
	tests := []ruleCase{
		{name: "created over what 1Gi holds", obj: cluster("700Mi", "1Gi"), wantErr: true},
		{name: "created over what the default volume holds", obj: cluster("700Mi", ""), wantErr: true},
		{name: "an earlier one changed elsewhere", obj: func() *kvv1.KVCluster { k := cluster("800Mi", "1Gi"); k.Spec.Partitions = 5; return k }(), old: earlier},
		{name: "an earlier one whose quota is raised", obj: cluster("810Mi", "1Gi"), old: earlier, wantErr: true},
		{name: "an earlier one whose quota is lowered, still over", obj: cluster("700Mi", "1Gi"), old: earlier, wantErr: true},
		{name: "an earlier one whose volume grows enough", obj: cluster("800Mi", "2Gi"), old: earlier},
	}
	// The rule and the operator agree on what a volume holds (specs.MaxQuotaBytes).
	for _, size := range []string{"512Mi", "1Gi", "3Gi", "9Gi"} {
		most := specs.MaxQuotaBytes(resource.MustParse(size)) >> 20
		tests = append(tests,
			ruleCase{name: fmt.Sprintf("created at what %s holds", size), obj: cluster(fmt.Sprintf("%dMi", most), size)},
			ruleCase{name: fmt.Sprintf("created a MiB over what %s holds", size), obj: cluster(fmt.Sprintf("%dMi", most+1), size), wantErr: true})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := rules(tt.obj, tt.old)
			quotaErr := strings.Contains(fmt.Sprint(errs), "space.backendQuota may be at most")
			if quotaErr != tt.wantErr || len(errs) > 0 && !quotaErr {
				t.Errorf("errors %v, want the quota refused: %t", errs, tt.wantErr)
			}
		})
	}
}

// TestTLSModeChanges: a running cluster moves from plaintext to TLS and back (from your Secrets
// only keeping their names, which the members use until they stop using TLS); not between the
// two kinds of TLS.
func TestTLSModeChanges(t *testing.T) {
	rules := crdRules(t)
	cluster := func(tls *kvv1.TLSSpec) *kvv1.KVCluster {
		k := &kvv1.KVCluster{}
		k.APIVersion, k.Kind, k.Name = "kvcluster.io/v1alpha1", "KVCluster", "kv"
		k.Spec.Version, k.Spec.Partitions, k.Spec.TLS = "3.7.3", 3, tls
		return k
	}
	operator := &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	secrets := &kvv1.TLSSecretNames{Server: "s", Peer: "p", Client: "c"}
	yours := &kvv1.TLSSpec{Mode: kvv1.TLSSecrets, Secrets: secrets}
	disabled := &kvv1.TLSSpec{Mode: kvv1.TLSDisabled}
	tests := []struct {
		name     string
		old, obj *kvv1.TLSSpec
		refused  bool
	}{
		{name: "plaintext to Operator", old: disabled, obj: operator},
		{name: "unset to Secrets", old: nil, obj: yours},
		{name: "Operator back to plaintext", old: operator, obj: disabled},
		{name: "Operator with plaintext clients accepted back to unset", old: &kvv1.TLSSpec{Mode: kvv1.TLSOperator, PlaintextClients: kvv1.PlaintextClientsAccept}, obj: nil},
		{name: "Operator to Secrets", old: operator, obj: yours, refused: true},
		{name: "Secrets to Operator", old: yours, obj: operator, refused: true},
		{name: "Secrets back to plaintext keeping their names", old: yours, obj: &kvv1.TLSSpec{Mode: kvv1.TLSDisabled, Secrets: secrets}},
		{name: "Secrets back to plaintext without their names", old: yours, obj: disabled, refused: true},
		{name: "Secrets back to plaintext renaming one", old: yours, obj: &kvv1.TLSSpec{Mode: kvv1.TLSDisabled, Secrets: &kvv1.TLSSecretNames{Server: "s", Peer: "p2", Client: "c"}}, refused: true},
		{name: "Secrets to unset", old: yours, obj: nil, refused: true},
		{name: "back in plaintext, the names dropped", old: &kvv1.TLSSpec{Mode: kvv1.TLSDisabled, Secrets: secrets}, obj: nil},
		{name: "Operator back to plaintext naming Secrets", old: operator, obj: &kvv1.TLSSpec{Mode: kvv1.TLSDisabled, Secrets: secrets}, refused: true},
		{name: "moving back from Secrets, a name changed", old: &kvv1.TLSSpec{Mode: kvv1.TLSDisabled, Secrets: secrets},
			obj: &kvv1.TLSSpec{Mode: kvv1.TLSDisabled, Secrets: &kvv1.TLSSecretNames{Server: "s", Peer: "p", Client: "c2"}}, refused: true},
		{name: "Secrets renamed", old: yours, obj: &kvv1.TLSSpec{Mode: kvv1.TLSSecrets, Secrets: &kvv1.TLSSecretNames{Server: "s2", Peer: "p", Client: "c"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := rules(cluster(tt.obj), cluster(tt.old))
			refused := strings.Contains(fmt.Sprint(errs), "tls.mode can change only") || strings.Contains(fmt.Sprint(errs), "tls.secrets can only stay")
			if refused != tt.refused || len(errs) > 0 && !refused {
				t.Errorf("errors %v, want the change refused: %t", errs, tt.refused)
			}
		})
	}
}

// TestTLSSecretsAndModes: your Secrets' names are required with mode Secrets, allowed with mode
// Disabled (kept while a cluster moves back from mode Secrets) and refused with mode Operator.
func TestTLSSecretsAndModes(t *testing.T) {
	rules := crdRules(t)
	secrets := &kvv1.TLSSecretNames{Server: "s", Peer: "p", Client: "c"}
	tests := []struct {
		tls     kvv1.TLSSpec
		refused string
	}{
		{tls: kvv1.TLSSpec{Mode: kvv1.TLSSecrets}, refused: "tls.secrets is required with mode Secrets"},
		{tls: kvv1.TLSSpec{Mode: kvv1.TLSSecrets, Secrets: secrets}},
		{tls: kvv1.TLSSpec{Mode: kvv1.TLSDisabled, Secrets: secrets}},
		{tls: kvv1.TLSSpec{Mode: kvv1.TLSOperator, Secrets: secrets}, refused: "tls.secrets is for mode Secrets"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s with names %t", tt.tls.Mode, tt.tls.Secrets != nil), func(t *testing.T) {
			k := &kvv1.KVCluster{}
			k.APIVersion, k.Kind, k.Name = "kvcluster.io/v1alpha1", "KVCluster", "kv"
			k.Spec.Version, k.Spec.Partitions, k.Spec.TLS = "3.7.3", 3, &tt.tls
			errs := fmt.Sprint(rules(k, nil))
			if tt.refused == "" && errs != "[]" || tt.refused != "" && !strings.Contains(errs, tt.refused) {
				t.Errorf("errors %s, want %q", errs, tt.refused)
			}
		})
	}
}
