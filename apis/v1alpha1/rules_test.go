package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// crdRules evaluates the CRD's validation rules as the API server does, outside of it: for the
// objects an API server cannot be given any more, those an earlier release admitted.
func crdRules(t testing.TB) func(obj, old *kvv1.KVCluster) field.ErrorList {
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

// FuzzAdmittedClustersMakeValidObjects: whatever KVCluster the API server admits (a name and
// namespace it accepts for any object, and the CRD's rules), every object the operator makes for
// it has a valid name for its kind and valid labels, so no cluster is admitted that the operator
// then cannot build (the Service names are DNS labels; the pods', with the StatefulSet's
// revision hash or a backup slot appended to the name, are label values of at most 63).
func FuzzAdmittedClustersMakeValidObjects(f *testing.F) {
	rules := crdRules(f)
	f.Add("kv", "default", uint8(3), true)
	f.Add(strings.Repeat("k", 52), strings.Repeat("n", 63), uint8(8), false)
	f.Add("ledger-2", "kvc-move-tls-c49", uint8(0), true)
	f.Fuzz(func(t *testing.T, name, namespace string, partitions uint8, tls bool) {
		if len(validation.IsDNS1123Subdomain(name)) > 0 || len(validation.IsDNS1123Label(namespace)) > 0 {
			return // the API server refuses these for any object
		}
		kvc := &kvv1.KVCluster{}
		kvc.APIVersion, kvc.Kind, kvc.Name, kvc.Namespace, kvc.UID = "kvcluster.io/v1alpha1", "KVCluster", name, namespace, "uid"
		kvc.Spec.Version, kvc.Spec.Partitions = "3.7.3", int32(partitions%specs.MaxMembers)+1
		kvc.Spec.Backup = &kvv1.BackupSpec{S3: &kvv1.S3Destination{Endpoint: "s3.example:9000", Bucket: "b", CredentialsSecret: "s3"}}
		kvc.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{Mode: kvv1.NetworkPolicyManaged}
		kvc.Spec.Deregistration = &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{URL: "https://registry.example/kv", Method: "DELETE"}, TimeoutSeconds: 300}
		if tls {
			kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
		}
		if len(rules(kvc, nil)) > 0 {
			return // refused at admission: what the rules are for
		}
		// The latest slot a backup Job is named after for a while: Unix minutes have 8 digits
		// until 2160.
		slot := time.Date(2159, 12, 31, 23, 59, 0, 0, time.UTC)
		now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		objects := map[string]any{
			"StatefulSet":  specs.StatefulSet(kvc, specs.MemberSet{Replicas: kvc.Spec.Partitions, Images: specs.Images{Operator: "op:1"}}),
			"Service/peer": specs.PeerService(kvc, ""), "Service/client": specs.ClientService(kvc, time.Time{}),
			"PodDisruptionBudget":   specs.PodDisruptionBudget(kvc, kvc.Spec.Partitions),
			"NetworkPolicy":         specs.NetworkPolicy(kvc, specs.OperatorPods{Namespace: "kvcluster-system", Labels: map[string]string{"app": "op"}}, ""),
			"ConfigMap/members":     specs.MembershipConfigMap(kvc, specs.NewClusterMembership(kvc), ""),
			"ConfigMap/guard":       specs.Guard(kvc),
			"Secret/tls":            specs.TLSSecret(kvc, specs.TLSServer, nil, ""),
			"Job/backup":            specs.BackupJob(kvc, specs.ScheduledBackupRun(kvc, backup.JobName(kvc.Name, slot)), "op:1"),
			"Job/final":             specs.BackupJob(kvc, specs.FinalBackupRun(kvc, now), "op:1"),
			"Job/preupgrade":        specs.PreUpgradeBackupJob(kvc, "https", "op:1", now),
			"Job/deregister":        specs.DeregistrationJob(kvc, "op:1", ""),
			"PersistentVolumeClaim": specs.MemberClaim(kvc, specs.DataClaimName(kvc, specs.MaxMembers-1), "", resource.MustParse("1Gi")),
		}
		for what, obj := range objects {
			data, err := json.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			var o struct {
				Metadata struct {
					Name   string            `json:"name"`
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
				Spec struct {
					Template struct {
						Metadata struct {
							Labels map[string]string `json:"labels"`
						} `json:"metadata"`
					} `json:"template"`
				} `json:"spec"`
			}
			if err := json.Unmarshal(data, &o); err != nil {
				t.Fatal(err)
			}
			objName := o.Metadata.Name
			problems := validation.IsDNS1123Subdomain(objName)
			switch kind, _, _ := strings.Cut(what, "/"); kind {
			case "Service":
				problems = validation.IsDNS1035Label(objName)
			case "StatefulSet": // its pods are labelled with "<name>-<revision hash of up to 10 characters>"
				problems = append(problems, validation.IsValidLabelValue(objName+"-0123456789")...)
				for ord := range specs.MaxMembers { // and named, and resolved, after their ordinals
					problems = append(problems, validation.IsDNS1123Label(specs.MemberName(kvc, ord))...)
				}
				for _, host := range specs.ServerNames(kvc) {
					problems = append(problems, validation.IsDNS1123Subdomain(host)...)
				}
			case "Job": // its pods are labelled with its name
				problems = append(problems, validation.IsValidLabelValue(objName)...)
			}
			for _, labels := range []map[string]string{o.Metadata.Labels, o.Spec.Template.Metadata.Labels} {
				for k, v := range labels {
					problems = append(problems, validation.IsQualifiedName(k)...)
					problems = append(problems, validation.IsValidLabelValue(v)...)
				}
			}
			if len(problems) > 0 {
				t.Errorf("admitted KVCluster %s/%s makes %s %q that is not valid: %v", namespace, name, what, objName, problems)
			}
		}
	})
}
