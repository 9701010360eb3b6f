package plan

import kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"

// Every reason the operator gives, on a condition or on an event, is named here.

// Reasons of the Ready, Reconciling and Stalled conditions (the verdict of a phase).
const (
	ReasonCreating           = "Creating"
	ReasonClusterReady       = "ClusterReady"
	ReasonMembersUnavailable = "MembersUnavailable"
	ReasonWritesRefused      = "WritesRefused"
	ReasonProgressDeadline   = "ProgressDeadlineExceeded"
	ReasonQuorumLost         = "QuorumLost"
	ReasonSpecChanged        = "SpecChanged"
	ReasonNotFailed          = "NotFailed"
	ReasonIdle               = "Idle"

	// While a running cluster is being changed.
	ReasonUpgrading         = "Upgrading"
	ReasonScaling           = "Scaling"
	ReasonReplacingMember   = "ReplacingMember"
	ReasonPreUpgradeBackup  = "PreUpgradeBackup"
	ReasonRolloutStalled    = "RolloutStalled"
	ReasonMembershipUnknown = "MembershipUnknown"
	ReasonUnknownMember     = "UnknownMember"
	ReasonExpandingVolumes  = "ExpandingVolumes"
	// ReasonPodsNotCreatable: spec.pods names something that does not exist, so the StatefulSet
	// controller cannot create a missing member pod, and no member is restarted onto the template.
	ReasonPodsNotCreatable = "PodsNotCreatable"

	// Objects the cluster needs but may not write.
	ReasonObjectConflict  = "ObjectConflict"
	ReasonLeftoverVolumes = "LeftoverVolumes"
	ReasonApplyRejected   = "ApplyRejected"
	ReasonTLSInvalid      = "TLSInvalid"
	// The spec asks for volumes larger than the StorageClass can make them.
	ReasonVolumeExpansionUnsupported = "VolumeExpansionUnsupported"
)

// Reasons of the BackupSucceeded condition, also used for the events announcing a backup.
const (
	ReasonBackupCompleted   = "BackupCompleted"
	ReasonBackupFailed      = "BackupFailed"
	ReasonInvalidSchedule   = "InvalidSchedule"
	ReasonFinalBackupFailed = "FinalBackupFailed"
)

// Reasons of the SpacePressure condition, also used for the events announcing a change.
const (
	ReasonNoSpace        = "NoSpace"
	ReasonSpaceExhausted = "SpaceExhausted"
	ReasonNearQuota      = "NearQuota"
	ReasonSpaceAvailable = "SpaceAvailable"
)

// Reasons of events only.
const (
	EventBackupStarted          = "BackupStarted"
	EventPreUpgradeBackup       = "PreUpgradeBackupStarted"
	EventMemberRestarted        = "MemberRestarted"
	EventLeaderMoved            = "LeaderMoved"
	EventMemberAdded            = "MemberAdded"
	EventMemberPromoted         = "MemberPromoted"
	EventMemberRemoved          = "MemberRemoved"
	EventMemberVolumeReset      = "MemberVolumeReset"
	EventPeerURLChanged         = "PeerURLChanged"
	EventMembershipChangeFailed = "MembershipChangeFailed"
	EventStaleAlarmDisarmed     = "StaleAlarmDisarmed"
	EventVolumeAdopted          = "VolumeAdopted"
	EventCertificateIssued      = "CertificateIssued"
	EventCARotated              = "CARotated"
	EventTLSUnset               = "TLSUnset"
	EventNetworkPolicyUnset     = "NetworkPolicyUnset"
	EventNetworkPolicyDeleted   = "NetworkPolicyDeleted"
	EventSpaceRecovered         = "SpaceRecovered"
	EventSpaceCompacted         = "SpaceCompacted"
	EventMemberDefragmented     = "MemberDefragmented"
	// The defragmentation asked for with kvcluster.io/defragment-now started, finished, failed.
	EventDefragmentationStarted  = "DefragmentationStarted"
	EventDefragmentationFinished = "DefragmentationFinished"
	EventDefragmentationFailed   = "DefragmentationFailed"
	EventNoSpaceDisarmed         = "NoSpaceDisarmed"
	EventFreeSpaceFailed         = "FreeSpaceFailed"
	EventVolumeExpansion         = "VolumeExpansionRequested"
	EventVolumesExpanded         = "VolumesExpanded"
	// EventInvalidDefragmentationSchedule: spec.space.defragmentation.schedule cannot be followed.
	EventInvalidDefragmentationSchedule = "InvalidDefragmentationSchedule"

	// The deletion steps.
	EventDrainStarted            = "DrainStarted"
	EventWritesFenced            = "WritesFenced"
	EventWritesNotFenced         = "WritesNotFenced"
	EventFinalBackupStarted      = "FinalBackupStarted"
	EventFinalBackupCompleted    = "FinalBackupCompleted"
	EventFinalBackupSkipped      = "FinalBackupSkipped"
	EventDeregistrationStarted   = "DeregistrationStarted"
	EventDeregistrationSucceeded = "DeregistrationSucceeded"
	EventDeregistrationFailed    = "DeregistrationFailed"
)

// warningReasons are verdicts that need a person even when the phase stays the same.
var warningReasons = map[string]bool{ReasonUnknownMember: true, ReasonPodsNotCreatable: true, ReasonObjectConflict: true, ReasonLeftoverVolumes: true, ReasonApplyRejected: true,
	ReasonTLSInvalid: true, ReasonVolumeExpansionUnsupported: true}

// blockingReasons are the verdicts of blockedVerdict: they end by themselves once the cause is gone.
var blockingReasons = map[string]bool{ReasonObjectConflict: true, ReasonLeftoverVolumes: true, ReasonApplyRejected: true, ReasonTLSInvalid: true,
	ReasonVolumeExpansionUnsupported: true}

// stepEvents are the reasons of the events a deletion step's Job gives as it starts and ends.
var stepEvents = map[kvv1.DeletionStepName]map[kvv1.DeletionOutcome]string{
	kvv1.StepFinalBackup: {kvv1.DeletionRunning: EventFinalBackupStarted, kvv1.DeletionSucceeded: EventFinalBackupCompleted,
		kvv1.DeletionFailed: ReasonFinalBackupFailed, kvv1.DeletionSkipped: EventFinalBackupSkipped},
	kvv1.StepDeregistration: {kvv1.DeletionRunning: EventDeregistrationStarted, kvv1.DeletionSucceeded: EventDeregistrationSucceeded,
		kvv1.DeletionFailed: EventDeregistrationFailed},
	kvv1.StepDrain: {kvv1.DeletionRunning: EventDrainStarted, kvv1.DeletionSucceeded: EventWritesFenced},
}

// StepEvent is the reason of the event saying a deletion step reached outcome.
func StepEvent(step kvv1.DeletionStepName, outcome kvv1.DeletionOutcome) string {
	return stepEvents[step][outcome]
}

// actionEvents are the reasons of the events announcing each rollout step.
var actionEvents = map[Action]string{
	ActPreUpgradeBackup: EventPreUpgradeBackup, ActRestartPod: EventMemberRestarted, ActMoveLeader: EventLeaderMoved,
	ActAddLearner: EventMemberAdded, ActPromote: EventMemberPromoted, ActRemove: EventMemberRemoved, ActWipeLearner: EventMemberVolumeReset,
	ActUpdatePeerURL: EventPeerURLChanged,
}

// Event is the reason of the event announcing the step; "" for ActWait.
func (a Action) Event() string { return actionEvents[a] }
