package plan

import (
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// WantsFinalBackup: a destination is configured and the policy is not Skip.
func WantsFinalBackup(kvc *kvv1.KVCluster) bool {
	return kvc.Spec.Backup != nil && kvc.Spec.Backup.FinalBackup != kvv1.FinalBackupSkip
}

// SkipsFinalBackup: the person deleting asked to go without it.
func SkipsFinalBackup(kvc *kvv1.KVCluster) bool {
	return kvc.Annotations[kvv1.AnnotationSkipFinalBackup] == "true"
}

// WantsFinalizer: some step must run on deletion before the members go.
func WantsFinalizer(kvc *kvv1.KVCluster) bool {
	return WantsFinalBackup(kvc) || kvc.Spec.Deregistration != nil
}

// BlocksOnFailure: the user chose to keep the KVCluster rather than lose a deletion step.
func BlocksOnFailure(kvc *kvv1.KVCluster) bool {
	return kvc.Spec.Backup != nil && kvc.Spec.Backup.OnFinalBackupFailure == kvv1.FinalBackupBlock && !SkipsFinalBackup(kvc)
}
