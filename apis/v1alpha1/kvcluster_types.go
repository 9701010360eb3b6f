package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KVClusterSpec is the desired state of an etcd-backed key-value cluster.
//
// +kubebuilder:validation:XValidation:rule="!has(self.backupSchedule) || self.backupSchedule.size() == 0 || has(self.backup)",message="backupSchedule needs spec.backup (s3 or pvc): where the backups go"
// +kubebuilder:validation:XValidation:rule="has(self.restore) == has(oldSelf.restore) && (!has(self.restore) || self.restore == oldSelf.restore)",message="restore is set at creation and cannot be changed: it only says where a new cluster's data came from"
// +kubebuilder:validation:XValidation:rule="(has(self.tls) ? self.tls.mode : 'Disabled') == (has(oldSelf.tls) ? oldSelf.tls.mode : 'Disabled') || (has(oldSelf.tls) ? oldSelf.tls.mode : 'Disabled') == 'Disabled' || (has(oldSelf.tls) ? oldSelf.tls.mode : 'Disabled') == 'Operator' && (has(self.tls) ? self.tls.mode : 'Disabled') == 'Disabled' || (has(oldSelf.tls) ? oldSelf.tls.mode : 'Disabled') == 'Secrets' && has(self.tls) && self.tls.mode == 'Disabled' && has(self.tls.secrets) && self.tls.secrets == oldSelf.tls.secrets",message="tls.mode can change only from plaintext to TLS (Operator or Secrets) and back to plaintext (the members move one at a time, clients keep working; from mode Secrets, keep tls.secrets as they are while the members move); between Operator and Secrets is not supported yet"
// +kubebuilder:validation:XValidation:rule="!has(self.tls) || self.tls.mode != 'Disabled' || !has(self.tls.secrets) || has(oldSelf.tls) && has(oldSelf.tls.secrets) && self.tls.secrets == oldSelf.tls.secrets",message="with tls.mode Disabled, tls.secrets can only stay as it was (while the members move back from mode Secrets) or go"
// +kubebuilder:validation:XValidation:rule="!has(self.space) || !has(self.space.backendQuota) || quantity(string(self.space.backendQuota)).asApproximateFloat() <= quantity((has(self.storage) && has(self.storage.size) ? string(self.storage.size) : '1Gi')).asApproximateFloat() * 0.85 - 256000000.0 || (oldSelf.hasValue() && has(oldSelf.value().space) && has(oldSelf.value().space.backendQuota) && oldSelf.value().space.backendQuota == self.space.backendQuota && has(oldSelf.value().storage) == has(self.storage) && (!has(self.storage) || has(oldSelf.value().storage.size) == has(self.storage.size) && (!has(self.storage.size) || oldSelf.value().storage.size == self.storage.size)))",message="space.backendQuota may be at most 85% of storage.size less 256MB (244Mi): the rest is the file system's own and the write-ahead log's (see the README's Disk space); the default, half of that, also leaves room for the second database file a defragmentation writes",optionalOldSelf=true
type KVClusterSpec struct {
	// Version is the etcd release to run, as MAJOR.MINOR.PATCH without a leading "v", e.g. "3.7.3".
	// etcd 3.6 and later are supported. Changing it starts a rolling upgrade, one member at a time.
	// Upgrades go one minor version at a time (3.6 to 3.7 from 3.6.11 on, as etcd requires);
	// downgrades are refused, except going back to status.currentVersion while an upgrade has not
	// finished (etcd's cluster version only moves once every member runs the new release).
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('v')",message="version must be written without a leading 'v', e.g. 3.7.3"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('v') || self.matches('^[0-9]+\\\\.[0-9]+\\\\.[0-9]+$')",message="version must be MAJOR.MINOR.PATCH, e.g. 3.7.3"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[0-9]+\\\\.[0-9]+\\\\.[0-9]+$') || (int(self.split('.')[0]) == 3 && int(self.split('.')[1]) >= 6)",message="etcd versions from 3.6.0 on are supported (3.x with x >= 6)"
	Version string `json:"version"`

	// Partitions is the number of etcd members (the StatefulSet's replicas). Odd numbers tolerate
	// the most failures per member: 3 survive one failure, 5 survive two. Changing it adds members
	// one at a time (each joins as a learner and is promoted once caught up) or removes the highest
	// ordinals one at a time (each leaves etcd before its pod goes; its volume is deleted).
	//
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=9
	Partitions int32 `json:"partitions"`

	// BackupSchedule is a standard 5-field cron expression (minute hour day-of-month month
	// day-of-week), e.g. "0 3 * * *", or one of @yearly, @monthly, @weekly, @daily, @hourly; in UTC
	// unless a time zone is given. Empty means no scheduled backups. As with Kubernetes CronJobs, a
	// wall-clock time skipped by a daylight-saving change has no slot that day, and one repeated by
	// it has two.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.size() == 0 || self.matches('^((CRON_)?TZ=[^[:space:]]+ +)?(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[^[:space:]@=]+( +[^[:space:]@=]+){4})$')",message="backupSchedule must have exactly 5 fields (minute hour day-of-month month day-of-week), e.g. '0 3 * * *', or be one of @yearly, @monthly, @weekly, @daily, @hourly; 6-field (seconds) schedules and @every are not accepted"
	BackupSchedule string `json:"backupSchedule,omitempty"`

	// Backup says where backups go (scheduled ones and the final one taken when the KVCluster is
	// deleted), how long they are kept, and what happens on deletion.
	//
	// +optional
	Backup *BackupSpec `json:"backup,omitempty"`

	// Restore bootstraps a new cluster from a backup instead of starting empty. Every member's data
	// is restored from the snapshot (after its checksum is verified) by the etcdutl of this
	// cluster's version, before etcd starts. Fixed at creation.
	//
	// +optional
	Restore *RestoreSpec `json:"restore,omitempty"`

	// TLS secures the members' client and peer traffic with mutual TLS: every client (the operator,
	// backup Jobs, applications) presents a certificate from the cluster's CA, and members
	// authenticate each other. Unset: plaintext to the operator, but the admission policy that
	// deploy/default installs gives new clusters mode Operator. A running cluster may move from
	// plaintext to TLS and back (see the README's TLS).
	//
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`

	// NetworkPolicy makes the operator keep a NetworkPolicy (<name>-members) admitting to the
	// members only what they need: the peer port from the other members; the client port from the
	// members, the cluster's own Jobs, the operator and the clients you select; the metrics port
	// from the members, the cluster's Jobs and the scrapers you select. Unset:
	// no NetworkPolicy, so clusters created before it keep every client; the admission policy
	// deploy/default installs gives new clusters mode Managed. It needs a network plugin that
	// enforces NetworkPolicies.
	//
	// +optional
	NetworkPolicy *NetworkPolicySpec `json:"networkPolicy,omitempty"`

	// Deregistration runs once on deletion, after the final backup and before the cluster goes,
	// e.g. to remove it from a service registry. Its failure follows backup.onFinalBackupFailure
	// (default: proceed with a Warning event).
	//
	// +optional
	Deregistration *DeregistrationSpec `json:"deregistration,omitempty"`

	// Repository is the container image repository for etcd; the image is
	// "<repository>:v<version>". Defaults to the operator's --etcd-repository
	// (gcr.io/etcd-development/etcd), e.g. to use a mirror.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[a-z0-9]+([._/:-][a-z0-9]+)*$`
	// +kubebuilder:validation:XValidation:rule="!self.split('/')[self.split('/').size() - 1].contains(':')",message="repository must not carry a tag (the operator appends :v<version>); a registry port is fine, e.g. registry.example.com:5000/etcd"
	Repository string `json:"repository,omitempty"`

	// Storage is the persistent volume each member keeps its data on.
	//
	// +optional
	// +kubebuilder:default={}
	Storage StorageSpec `json:"storage,omitzero"`

	// Space is how large each member's database may grow and how much history etcd keeps. A
	// change restarts the members one at a time.
	//
	// +optional
	Space SpaceSpec `json:"space,omitzero"`

	// Pods says where the members, and the Jobs the operator starts for the cluster (backups,
	// deregistration), run and what they carry. A change rolls the members one at a time, as a
	// version change does.
	//
	// +optional
	Pods PodPolicy `json:"pods,omitzero"`

	// Resources are the compute resources of each etcd member's container.
	//
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !has(self.limits) || ['cpu', 'memory', 'ephemeral-storage'].all(r, !(r in self.requests) || !(r in self.limits) || quantity(string(self.requests[r])).compareTo(quantity(string(self.limits[r]))) <= 0)",message="resources.requests must not exceed resources.limits (for cpu, memory and ephemeral-storage): the member pods could never be created"
	Resources corev1.ResourceRequirements `json:"resources,omitzero"`

	// ProgressDeadlineSeconds is how long creation (or recovery of a lost quorum) may make no
	// progress before the cluster is marked Failed.
	//
	// +optional
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=30
	// +kubebuilder:validation:Maximum=86400
	ProgressDeadlineSeconds int32 `json:"progressDeadlineSeconds,omitempty"`
}

// PodPolicy is the part of the member and Job pods a KVCluster sets.
//
// +kubebuilder:validation:XValidation:rule="!has(self.labels) || self.labels.all(k, !k.startsWith('app.kubernetes.io/') && !k.startsWith('kvcluster.io/') && !(k in ['controller-revision-hash', 'statefulset.kubernetes.io/pod-name', 'apps.kubernetes.io/pod-index', 'batch.kubernetes.io/job-name', 'batch.kubernetes.io/controller-uid', 'job-name', 'controller-uid']))",message="pods.labels may not set app.kubernetes.io/* or kvcluster.io/* labels, nor those of the StatefulSet and Job controllers: the operator, its selectors and those controllers own them"
// +kubebuilder:validation:XValidation:rule="!has(self.annotations) || self.annotations.all(k, !k.startsWith('kvcluster.io/'))",message="pods.annotations may not set kvcluster.io/* annotations: the operator owns them"
// +kubebuilder:validation:XValidation:rule="!has(self.topologySpreadConstraints) || self.topologySpreadConstraints.all(c, !has(c.labelSelector))",message="pods.topologySpreadConstraints take no labelSelector: the operator gives each one the cluster's members"
// +kubebuilder:validation:XValidation:rule="!has(self.tolerations) || self.tolerations.all(t, (!has(t.effect) || t.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute']) && (!has(t.operator) || t.operator in ['Equal', 'Exists']) && (has(t.key) || has(t.operator) && t.operator == 'Exists') && (!has(t.operator) || t.operator != 'Exists' || !has(t.value)) && (!has(t.tolerationSeconds) || has(t.effect) && t.effect == 'NoExecute'))",message="pods.tolerations: effect must be NoSchedule, PreferNoSchedule or NoExecute, operator Equal or Exists; a toleration without a key needs operator Exists, one with operator Exists takes no value, and tolerationSeconds needs effect NoExecute"
type PodPolicy struct {
	// NodeSelector: members and Jobs run only on nodes with these labels.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations of members and Jobs, e.g. to run on tainted nodes set aside for storage.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Affinity of the members. Unset: preferably no two members of the cluster on one node.
	//
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// TopologySpreadConstraints of the members, each over the cluster's members (the operator sets
	// their labelSelector). Unset: spread across zones and across nodes, softly (maxSkew 1,
	// ScheduleAnyway), so a zone or node going down takes as few members as the nodes allow.
	//
	// +optional
	// +listType=map
	// +listMapKey=topologyKey
	// +listMapKey=whenUnsatisfiable
	// +kubebuilder:validation:MaxItems=8
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`

	// PriorityClassName of members and Jobs: a high priority keeps members from being preempted.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// Labels added to member and Job pods (not app.kubernetes.io/* nor kvcluster.io/*, which the
	// operator sets).
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations added to member and Job pods (not kvcluster.io/*).
	//
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// ImagePullSecrets to pull the etcd image (members) and the operator's image (Jobs) from a
	// private registry: Secrets in the KVCluster's namespace.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// ServiceAccountName of the pods that reach the backups' store: members (a restore runs in
	// them) and backup Jobs, not the deregistration Job. E.g. one bound to a cloud role, so that
	// backups and restores reach the bucket without static keys (s3.workloadIdentity). No API
	// token is mounted (the cloud's webhook or agent gives its credentials). It must exist: a pod
	// naming a missing one is not created. Unset: the namespace's default.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
}

// TLSMode is where a cluster's certificates come from.
//
// +kubebuilder:validation:Enum=Operator;Secrets;Disabled
type TLSMode string

const (
	// TLSOperator: the operator creates a CA for the cluster and issues the members', its own and
	// applications' certificates, in Secrets the cluster owns (<name>-tls-ca, -server, -peer,
	// -client), and renews them.
	TLSOperator TLSMode = "Operator"
	// TLSSecrets: certificates come from Secrets you name, in the shape cert-manager writes
	// (tls.crt, tls.key, ca.crt).
	TLSSecrets TLSMode = "Secrets"
	// TLSDisabled: plaintext.
	TLSDisabled TLSMode = "Disabled"
)

// TLSSpec says where the certificates come from.
//
// +kubebuilder:validation:XValidation:rule="self.mode != 'Secrets' || has(self.secrets)",message="tls.secrets is required with mode Secrets"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Operator' || !has(self.secrets)",message="tls.secrets is for mode Secrets (and mode Disabled while a cluster moves back from it): mode Operator issues its own"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Disabled' || !has(self.plaintextClients) || self.plaintextClients == 'Refuse'",message="plaintextClients: Accept needs TLS (mode Operator or Secrets): without it every client is plaintext"
type TLSSpec struct {
	// Mode is Operator (certificates issued and renewed by the operator), Secrets (yours) or
	// Disabled (plaintext).
	//
	// +required
	Mode TLSMode `json:"mode"`

	// Secrets names the Secrets holding tls.crt, tls.key and ca.crt (mode Secrets): server for the
	// members' client port, peer between members (its certificate must allow both server and
	// client authentication), client for the operator and backup Jobs. Kept with mode Disabled,
	// members moving back to plaintext use them until they no longer need certificates.
	//
	// +optional
	Secrets *TLSSecretNames `json:"secrets,omitempty"`

	// PlaintextClients says whether the members' client port also accepts plaintext clients:
	// Refuse (the default) or Accept. Accept is for moving a running cluster to TLS: the members
	// move to TLS and accept both until you set Refuse, once your applications use TLS; and
	// before moving it back to plaintext: set Accept, move your applications to plaintext, then
	// mode Disabled.
	//
	// +optional
	// +kubebuilder:default=Refuse
	PlaintextClients PlaintextClients `json:"plaintextClients,omitempty"`
}

// PlaintextClients says whether a TLS cluster's client port also accepts plaintext clients.
//
// +kubebuilder:validation:Enum=Refuse;Accept
type PlaintextClients string

const (
	PlaintextClientsRefuse PlaintextClients = "Refuse"
	PlaintextClientsAccept PlaintextClients = "Accept"
)

// NetworkPolicyMode says whether the operator keeps a NetworkPolicy for the cluster.
//
// +kubebuilder:validation:Enum=Managed;Disabled
type NetworkPolicyMode string

const (
	// NetworkPolicyManaged: the operator keeps the cluster's NetworkPolicy.
	NetworkPolicyManaged NetworkPolicyMode = "Managed"
	// NetworkPolicyDisabled: none (for instance, you bring your own); one the operator made is
	// deleted.
	NetworkPolicyDisabled NetworkPolicyMode = "Disabled"
)

// NetworkPolicySpec says who may reach the members, besides the members themselves, the cluster's
// own Jobs and the operator, which are always admitted.
//
// +kubebuilder:validation:XValidation:rule="self.mode == 'Managed' || (!has(self.clientsFrom) && !has(self.metricsFrom))",message="clientsFrom and metricsFrom need mode Managed"
type NetworkPolicySpec struct {
	// Mode is Managed (the default) or Disabled.
	//
	// +optional
	// +kubebuilder:default=Managed
	Mode NetworkPolicyMode `json:"mode,omitempty"`

	// ClientsFrom are the pods (by pod and namespace selector, or address block) that may connect
	// to the client port (2379), as in a NetworkPolicy's ingress rule. Empty: every pod in the
	// KVCluster's namespace. With TLS, a client also needs a certificate of the cluster's CA.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +kubebuilder:validation:XValidation:rule="self.all(p, has(p.podSelector) || has(p.namespaceSelector) || has(p.ipBlock))",message="each peer needs a podSelector, a namespaceSelector or an ipBlock"
	// +kubebuilder:validation:XValidation:rule="self.all(p, !has(p.ipBlock) || (!has(p.podSelector) && !has(p.namespaceSelector)))",message="a peer with an ipBlock can have no selector (as in a NetworkPolicy)"
	// +kubebuilder:validation:XValidation:rule="self.all(p, !has(p.ipBlock) || isCIDR(p.ipBlock.cidr))",message="ipBlock.cidr must be a CIDR, e.g. 10.0.0.0/8"
	ClientsFrom []networkingv1.NetworkPolicyPeer `json:"clientsFrom,omitempty"`

	// MetricsFrom are the pods that may read the metrics port (2381: /metrics, /health, /livez),
	// e.g. your Prometheus's namespace: [{namespaceSelector: {matchLabels:
	// {kubernetes.io/metadata.name: monitoring}}}]. Empty: every pod in the KVCluster's namespace.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +kubebuilder:validation:XValidation:rule="self.all(p, has(p.podSelector) || has(p.namespaceSelector) || has(p.ipBlock))",message="each peer needs a podSelector, a namespaceSelector or an ipBlock"
	// +kubebuilder:validation:XValidation:rule="self.all(p, !has(p.ipBlock) || (!has(p.podSelector) && !has(p.namespaceSelector)))",message="a peer with an ipBlock can have no selector (as in a NetworkPolicy)"
	// +kubebuilder:validation:XValidation:rule="self.all(p, !has(p.ipBlock) || isCIDR(p.ipBlock.cidr))",message="ipBlock.cidr must be a CIDR, e.g. 10.0.0.0/8"
	MetricsFrom []networkingv1.NetworkPolicyPeer `json:"metricsFrom,omitempty"`
}

// TLSSecretNames are the names of the Secrets of mode Secrets, in the KVCluster's namespace.
type TLSSecretNames struct {
	// +required
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Server string `json:"server"`
	// +required
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Peer string `json:"peer"`
	// +required
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Client string `json:"client"`
}

// BackupSpec configures backups. Snapshots are written to the destination as
// <prefix>/<namespace>/<name>/<job name>.db, with metadata beside each.
//
// +kubebuilder:validation:XValidation:rule="has(self.s3) != has(self.pvc)",message="backup needs exactly one destination: s3 or pvc"
type BackupSpec struct {
	// S3 is an S3-compatible bucket.
	//
	// +optional
	S3 *S3Destination `json:"s3,omitempty"`

	// PVC is a PersistentVolumeClaim of the KVCluster's namespace, for clusters without an object store.
	//
	// +optional
	PVC *PVCDestination `json:"pvc,omitempty"`

	// TimeZone of backupSchedule, an IANA name such as "Europe/Berlin". Default: UTC.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=64
	TimeZone string `json:"timeZone,omitempty"`

	// StartingDeadlineSeconds: a slot missed (e.g. while the operator was down) still runs if it is
	// at most this late; only the most recent missed slot ever runs.
	//
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=60
	// +kubebuilder:validation:Maximum=86400
	StartingDeadlineSeconds int32 `json:"startingDeadlineSeconds,omitempty"`

	// Suspend pauses scheduled backups; the final backup still follows finalBackup.
	//
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// JobHistoryLimit is how many finished Jobs of successful scheduled backups are kept (and the
	// last failed one), so Jobs never pile up; the same for on-demand backups (kvcluster.io/backup-now).
	//
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	JobHistoryLimit int32 `json:"jobHistoryLimit,omitempty"`

	// Retention prunes old snapshots of scheduled backups from the bucket after each successful
	// backup. Final backups are never pruned, nor the newest snapshot.
	//
	// +optional
	// +kubebuilder:default={keepLast: 7}
	Retention BackupRetention `json:"retention,omitzero"`

	// FinalBackup is Take (default) to snapshot the cluster when the KVCluster is deleted, before
	// its members go, or Skip. The annotation kvcluster.io/skip-final-backup: "true" skips it for
	// one deletion, e.g. in an emergency.
	//
	// +optional
	// +kubebuilder:default=Take
	FinalBackup FinalBackupPolicy `json:"finalBackup,omitempty"`

	// FinalBackupTimeoutSeconds bounds the wait for the final backup.
	//
	// +optional
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=30
	// +kubebuilder:validation:Maximum=86400
	FinalBackupTimeoutSeconds int32 `json:"finalBackupTimeoutSeconds,omitempty"`

	// OnFinalBackupFailure is Proceed (default): when the final backup fails, times out or cannot
	// start, the deletion goes on with a Warning event saying what was lost, so a GitOps prune
	// never hangs. Block keeps the KVCluster (and its data) until the backup succeeds or a person
	// annotates kvcluster.io/skip-final-backup=true. When the namespace itself is being deleted,
	// nothing can be protected (no Job can start, the members are being deleted): the deletion
	// goes on either way, and the loss is logged by the operator and counted in its metrics.
	//
	// +optional
	// +kubebuilder:default=Proceed
	OnFinalBackupFailure FinalBackupFailurePolicy `json:"onFinalBackupFailure,omitempty"`

	// DrainSeconds: on deletion, before the final backup, the client Service stops taking new
	// connections and clients get this long to finish; then writes are fenced (etcd refuses puts,
	// transactions with writes and lease grants; deletes still pass) so the final backup holds
	// the cluster's last state. 0 fences at once.
	//
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=600
	DrainSeconds *int32 `json:"drainSeconds,omitempty"`
}

// BackupRetention says which snapshots of scheduled backups are kept in the bucket.
type BackupRetention struct {
	// KeepLast is how many of the newest snapshots are kept.
	//
	// +optional
	// +kubebuilder:default=7
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	KeepLast int32 `json:"keepLast,omitempty"`

	// MaxAge also deletes snapshots older than this (e.g. "720h"), but never the newest one.
	//
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
}

// FinalBackupPolicy says whether a final backup is taken on deletion.
//
// +kubebuilder:validation:Enum=Take;Skip
type FinalBackupPolicy string

const (
	FinalBackupTake FinalBackupPolicy = "Take"
	FinalBackupSkip FinalBackupPolicy = "Skip"
)

// FinalBackupFailurePolicy says what a failed final backup does to the deletion.
//
// +kubebuilder:validation:Enum=Proceed;Block
type FinalBackupFailurePolicy string

const (
	FinalBackupProceed FinalBackupFailurePolicy = "Proceed"
	FinalBackupBlock   FinalBackupFailurePolicy = "Block"
)

// S3Destination is a bucket of an S3-compatible store, addressed path-style.
//
// +kubebuilder:validation:XValidation:rule="has(self.credentialsSecret) != (has(self.workloadIdentity) && self.workloadIdentity)",message="s3 needs exactly one source of credentials: credentialsSecret, or workloadIdentity: true"
type S3Destination struct {
	// Endpoint is host[:port] of the store, without scheme, e.g. "s3.eu-central-1.amazonaws.com" or
	// "minio.storage.svc:9000".
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="!self.contains('://')",message="endpoint is host[:port] without a scheme; use insecure: true for plain HTTP"
	Endpoint string `json:"endpoint"`

	// Bucket name; it must exist.
	//
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9.-]*[a-z0-9]$`
	Bucket string `json:"bucket"`

	// Prefix of the object keys, without leading or trailing "/".
	//
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.endsWith('/')",message="prefix must not start or end with '/'"
	// +kubebuilder:validation:XValidation:rule="self.split('/').all(s, s != '..' && s != '.')",message="prefix must not contain '.' or '..' path segments"
	Prefix string `json:"prefix,omitempty"`

	// Region of the bucket.
	//
	// +optional
	// +kubebuilder:default=us-east-1
	Region string `json:"region,omitempty"`

	// Insecure uses plain HTTP instead of TLS, for a store inside the cluster.
	//
	// +optional
	Insecure bool `json:"insecure,omitempty"`

	// CredentialsSecret names a Secret in the KVCluster's namespace with the keys
	// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. Only the backup Jobs (and a restoring member's
	// init container) read it; the operator never does. Exactly one of credentialsSecret and
	// workloadIdentity.
	//
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	CredentialsSecret string `json:"credentialsSecret,omitempty"`

	// WorkloadIdentity: no static keys; the pods that reach the store (backup Jobs, a restoring
	// member's init container) take short-lived credentials from the cloud identity of their
	// ServiceAccount (spec.pods.serviceAccountName), as the AWS SDKs do: a web identity token
	// (EKS IRSA: AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, exchanged at AWS_ENDPOINT_URL_STS
	// or the region's STS), EKS Pod Identity (AWS_CONTAINER_CREDENTIALS_FULL_URI), or else the
	// node's instance role.
	//
	// +optional
	WorkloadIdentity bool `json:"workloadIdentity,omitempty"`
}

// DeregistrationSpec is either an HTTP call or a container run to completion; both run as a Job
// named <cluster>-deregister, so the operator itself never reads a Secret.
//
// +kubebuilder:validation:XValidation:rule="has(self.http) != has(self.job)",message="deregistration needs exactly one of http or job"
type DeregistrationSpec struct {
	// HTTP sends one request, retried on failure.
	// +optional
	HTTP *HTTPDeregistration `json:"http,omitempty"`

	// Job runs a container of your own.
	// +optional
	Job *JobDeregistration `json:"job,omitempty"`

	// TimeoutSeconds bounds the whole step.
	//
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=3600
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// HTTPDeregistration is a request to a URL, given inline or from a Secret (it may hold a token).
//
// +kubebuilder:validation:XValidation:rule="has(self.url) != has(self.urlSecret)",message="http needs exactly one of url or urlSecret"
// +kubebuilder:validation:XValidation:rule="!has(self.urlSecret) || self.urlSecret.name.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')",message="urlSecret.name must be the name of a Secret in the KVCluster's namespace (lower-case letters, digits, '-' and '.')"
type HTTPDeregistration struct {
	// URL to call.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://`
	URL string `json:"url,omitempty"`

	// URLSecret is a key of a Secret in the KVCluster's namespace holding the URL.
	// +optional
	URLSecret *corev1.SecretKeySelector `json:"urlSecret,omitempty"`

	// Method of the request.
	// +optional
	// +kubebuilder:default=POST
	// +kubebuilder:validation:Enum=POST;PUT;DELETE;GET
	Method string `json:"method,omitempty"`

	// Retries after a failed attempt (a non-2xx answer or no answer).
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	Retries int32 `json:"retries,omitempty"`
}

// JobDeregistration is a container of your own, run once.
type JobDeregistration struct {
	// Image to run.
	// +required
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// Command and Args of the container.
	// +optional
	Command []string `json:"command,omitempty"`
	// +optional
	Args []string `json:"args,omitempty"`
}

// RestoreSpec names the backup a new cluster starts from.
//
// +kubebuilder:validation:XValidation:rule="has(self.s3) != has(self.pvc)",message="restore needs exactly one source: s3 or pvc"
type RestoreSpec struct {
	// S3 is the bucket holding the snapshot (its prefix is ignored: key is the full object key).
	//
	// +optional
	S3 *S3Destination `json:"s3,omitempty"`

	// PVC is the PersistentVolumeClaim holding the snapshot (its prefix is ignored), mounted read-only.
	//
	// +optional
	PVC *PVCDestination `json:"pvc,omitempty"`

	// Key of the snapshot object, e.g. "team/prod/orders/orders-final.db" (status.lastBackup.location
	// of the cluster it came from, without "s3://<bucket>/" or "pvc://<claim>/").
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.split('/').all(s, s != '..' && s != '.')",message="key must not contain '.' or '..' path segments"
	Key string `json:"key"`

	// SHA256 the snapshot must have (status.lastBackup.sha256 of its cluster); the restore refuses
	// any other content. Without it, the checksum in the metadata beside the snapshot is used.
	//
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	SHA256 string `json:"sha256,omitempty"`
}

// PVCDestination is a directory tree on a PersistentVolumeClaim. Every backup Job mounts it: on a
// cluster of several nodes use a ReadWriteMany claim, or the Jobs can only run on the node that
// holds a ReadWriteOnce one.
type PVCDestination struct {
	// ClaimName of an existing PersistentVolumeClaim in the KVCluster's namespace.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	ClaimName string `json:"claimName"`

	// Prefix of the paths on the volume, without leading or trailing "/".
	//
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.endsWith('/') && !self.contains('..')",message="prefix must not start or end with '/' nor contain '..'"
	Prefix string `json:"prefix,omitempty"`
}

// BackupRecord describes one finished backup.
type BackupRecord struct {
	// Job that took it.
	Job string `json:"job"`
	// Succeeded says whether the backup completed and was verified.
	Succeeded bool `json:"succeeded"`
	// Location of the snapshot, s3://bucket/key or pvc://claim/key.
	// +optional
	Location string `json:"location,omitempty"`
	// Size in bytes.
	// +optional
	Size int64 `json:"size,omitempty"`
	// SHA256 of the snapshot object.
	// +optional
	SHA256 string `json:"sha256,omitempty"`
	// Revision is the etcd revision the snapshot contains at least.
	// +optional
	Revision int64 `json:"revision,omitempty"`
	// EtcdVersion is the snapshot's storage version (e.g. 3.7.0): a snapshot restores only into
	// etcd of this minor version or later.
	// +optional
	EtcdVersion string `json:"etcdVersion,omitempty"`
	// StartTime of the Job: with completionTime, how long the backup took.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime of the Job.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Pruned is how many older snapshots the retention deleted after this one was verified.
	// +optional
	Pruned int32 `json:"pruned,omitempty"`
	// WritesFenced is true for a final backup taken after the cluster stopped accepting writes:
	// it holds the cluster's last state.
	// +optional
	WritesFenced bool `json:"writesFenced,omitempty"`
	// Message is the backup's own account of a failure, or of the problems a successful backup met.
	// +optional
	Message string `json:"message,omitempty"`
}

// BackupRequest is an on-demand backup, asked for with the kvcluster.io/backup-now annotation.
type BackupRequest struct {
	// Token is the annotation's value this request answers.
	Token string `json:"token"`
	// State is Pending (waiting for another backup to finish or for the cluster to form), Running,
	// Succeeded or Failed.
	State BackupRequestState `json:"state"`
	// Job that takes the backup, once started.
	// +optional
	Job string `json:"job,omitempty"`
	// Message says what a pending request waits for, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
	// Backup is the finished backup: where it was written, its size, digest and revision.
	// +optional
	Backup *BackupRecord `json:"backup,omitempty"`
}

// DefragmentRequest is an on-demand defragmentation of every member, asked for with the
// kvcluster.io/defragment-now annotation.
type DefragmentRequest struct {
	// Token is the annotation's value this request answers.
	Token string `json:"token"`
	// State is Pending (waiting until the cluster is Ready, every member answers and no backup
	// runs), Running, Succeeded or Failed.
	State BackupRequestState `json:"state"`
	// StartTime is when the first member's defragmentation started.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// Defragmented are the members defragmented for this request so far.
	// +optional
	Defragmented []string `json:"defragmented,omitempty"`
	// Message says what a pending or running request waits for, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// BackupRequestState is where an on-demand backup (or defragmentation) stands.
//
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type BackupRequestState string

const (
	BackupRequestPending   BackupRequestState = "Pending"
	BackupRequestRunning   BackupRequestState = "Running"
	BackupRequestSucceeded BackupRequestState = "Succeeded"
	BackupRequestFailed    BackupRequestState = "Failed"
)

// DeletionStepName names a step the operator takes when a KVCluster is deleted, before its members go.
//
// +kubebuilder:validation:Enum=Drain;FinalBackup;Deregistration
type DeletionStepName string

const (
	// StepDrain stops new client connections, waits backup.drainSeconds, and fences writes.
	StepDrain DeletionStepName = "Drain"
	// StepFinalBackup takes the final backup.
	StepFinalBackup DeletionStepName = "FinalBackup"
	// StepDeregistration runs spec.deregistration.
	StepDeregistration DeletionStepName = "Deregistration"
)

// DeletionOutcome is where a deletion step stands.
//
// +kubebuilder:validation:Enum=Running;Succeeded;Failed;Skipped
type DeletionOutcome string

const (
	DeletionRunning   DeletionOutcome = "Running"
	DeletionSucceeded DeletionOutcome = "Succeeded"
	DeletionFailed    DeletionOutcome = "Failed"
	DeletionSkipped   DeletionOutcome = "Skipped"
)

// DeletionStep is one step of a deletion in progress.
type DeletionStep struct {
	Name    DeletionStepName `json:"name"`
	Outcome DeletionOutcome  `json:"outcome"`
	// Job that runs the step, if it runs as one.
	// +optional
	Job string `json:"job,omitempty"`
	// StartTime is when the step began; its time limit counts from there.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when the step ended.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Revision is, for Drain, the etcd revision writes were fenced at.
	// +optional
	Revision int64 `json:"revision,omitempty"`
	// Message says what the step did, or why it failed or was skipped.
	// +optional
	Message string `json:"message,omitempty"`
}

// StorageSpec describes the PersistentVolumeClaim of each member.
//
// +kubebuilder:validation:XValidation:rule="has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",message="storage.storageClassName cannot be changed after creation (a volume cannot move to another StorageClass)"
type StorageSpec struct {
	// Size of each member's volume. It may grow: the operator expands each member's claim (its
	// StorageClass must allow volume expansion), and once every member's volume has the new size
	// the default backend quota follows it (members restart one at a time). It never shrinks:
	// volumes cannot. At least 512Mi: a member's write-ahead log alone may take 256MB.
	//
	// +optional
	// +kubebuilder:default="1Gi"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('512Mi')) >= 0",message="storage.size must be at least 512Mi: a member's write-ahead log alone may take 244Mi, and its database needs room beside it"
	Size resource.Quantity `json:"size,omitzero"`

	// StorageClassName of the volumes; empty uses the cluster's default StorageClass.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	StorageClassName string `json:"storageClassName,omitempty"`
}

// SpaceSpec is how large each member's database may grow and how much history etcd keeps.
type SpaceSpec struct {
	// BackendQuota is the size of a member's database file at which etcd raises its NOSPACE alarm
	// and the whole cluster refuses writes (the operator then frees space: see the README's
	// "Running out of space"). At most 85% of storage.size less 256MB: the file system keeps a share
	// and the write-ahead log takes up to 256MB (see the README's "Disk space"). Default: half of
	// that, at most 8Gi, so a defragmentation's copy of the database fits too. While volumes are
	// being expanded, the members keep the quota of the size they all have (status.volumeSize).
	//
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('16Mi')) >= 0 && quantity(string(self)).compareTo(quantity('8Gi')) <= 0",message="space.backendQuota must be from 16Mi to 8Gi (etcd's largest recommended database)"
	BackendQuota *resource.Quantity `json:"backendQuota,omitempty"`

	// AutoCompaction is how much history each member keeps: older revisions are compacted away
	// (their space is reused, the file does not shrink). Default: Periodic, one hour.
	//
	// +optional
	AutoCompaction AutoCompactionSpec `json:"autoCompaction,omitzero"`

	// Defragmentation is when the operator defragments members in routine operation, returning
	// the pages compaction freed to the disk and the headroom under the quota. (Under the NOSPACE
	// alarm it always defragments.) Default: mode Auto, at any time.
	//
	// +optional
	Defragmentation DefragmentationSpec `json:"defragmentation,omitzero"`
}

// DefragmentationMode says whether the operator defragments members in routine operation.
//
// +kubebuilder:validation:Enum=Auto;Off
type DefragmentationMode string

const (
	// DefragmentationAuto defragments a member once it is worth it (see DefragmentationSpec).
	DefragmentationAuto DefragmentationMode = "Auto"
	// DefragmentationOff never defragments in routine operation.
	DefragmentationOff DefragmentationMode = "Off"
)

// DefragmentationSpec is the routine defragmentation policy.
type DefragmentationSpec struct {
	// Mode Auto defragments a member whose database file has reached half the quota with a quarter
	// of it free pages, or with enough free pages to bring a file past 80% of the quota back under
	// it: one member at a time, the followers first and the leader last, at most once an hour each,
	// only while the cluster is Ready, every member answers, no alarm is raised and no backup
	// runs. A member serves no request while it is defragmented. Off: never.
	//
	// +optional
	// +kubebuilder:default=Auto
	Mode DefragmentationMode `json:"mode,omitempty"`

	// Schedule limits Auto to the hour after each slot of a cron schedule (5 fields or a
	// descriptor, UTC unless it starts with CRON_TZ=<zone>), e.g. "0 3 * * *" for 03:00 to 04:00
	// each day. Empty: at any time.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.size() == 0 || self.matches('^((CRON_)?TZ=[^[:space:]]+ +)?(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[^[:space:]@=]+( +[^[:space:]@=]+){4})$')",message="defragmentation.schedule must have exactly 5 fields (minute hour day-of-month month day-of-week), e.g. '0 3 * * *', or be one of @yearly, @monthly, @weekly, @daily, @hourly; 6-field (seconds) schedules and @every are not accepted"
	Schedule string `json:"schedule,omitempty"`
}

// AutoCompactionMode says what an auto-compaction retention counts.
//
// +kubebuilder:validation:Enum=Periodic;Revision
type AutoCompactionMode string

const (
	// AutoCompactionPeriodic keeps the history of the last retention (a duration).
	AutoCompactionPeriodic AutoCompactionMode = "Periodic"
	// AutoCompactionRevision keeps the last retention revisions.
	AutoCompactionRevision AutoCompactionMode = "Revision"
)

// AutoCompactionSpec is etcd's auto-compaction.
//
// +kubebuilder:validation:XValidation:rule="!has(self.retention) || (self.mode == 'Revision' ? self.retention.matches('^[1-9][0-9]{0,15}$') : self.retention.matches('^([0-9]+(\\\\.[0-9]+)?(ms|s|m|h))+$') && duration(self.retention) >= duration('1m') && duration(self.retention) <= duration('8760h'))",message="autoCompaction.retention must be a duration from 1m to 8760h (a year) such as 30m or 1h for mode Periodic (etcd reads 0 as no compaction at all), a number of revisions such as 10000 for mode Revision"
type AutoCompactionSpec struct {
	// Mode is Periodic (keep the history of the last retention, a duration) or Revision (keep the
	// last retention revisions).
	//
	// +optional
	// +kubebuilder:default=Periodic
	Mode AutoCompactionMode `json:"mode,omitempty"`

	// Retention is a duration (Periodic, default 1h) or a number of revisions (Revision, default
	// 10000).
	//
	// +optional
	Retention string `json:"retention,omitempty"`
}

// Phase is the coarse lifecycle state of a KVCluster.
//
// +kubebuilder:validation:Enum=Creating;Ready;Upgrading;Failed
type Phase string

const (
	// PhaseCreating: members are being started and have not yet formed a healthy cluster.
	PhaseCreating Phase = "Creating"
	// PhaseReady: the cluster formed and serves requests; see the Ready condition for its health now.
	PhaseReady Phase = "Ready"
	// PhaseUpgrading: the operator is changing a running cluster one member at a time: moving
	// members to a new version or pod template, adding or removing members, or replacing a member
	// that lost its data. The Reconciling condition's reason and message say which, and how far.
	PhaseUpgrading Phase = "Upgrading"
	// PhaseFailed: the operator cannot make progress without a person; the Stalled condition says why.
	PhaseFailed Phase = "Failed"
)

// Condition types published in status.conditions.
const (
	// ConditionReady is True when every member is ready and etcd reports a healthy cluster of the
	// expected size.
	ConditionReady = "Ready"
	// ConditionReconciling is True while the operator is working towards the spec (kstatus InProgress).
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when progress stopped and needs a person (kstatus Failed).
	ConditionStalled = "Stalled"
	// ConditionBackupSucceeded says whether the most recent backup succeeded, or why backups cannot run.
	ConditionBackupSucceeded = "BackupSucceeded"
	// ConditionSpacePressure is True while etcd refuses writes for want of space (a NOSPACE alarm)
	// or a member's database has grown past 80% of the quota.
	ConditionSpacePressure = "SpacePressure"
)

// Annotations a person may set on a KVCluster.
const (
	// AnnotationSkipFinalBackup: "true" deletes the KVCluster without the final backup.
	AnnotationSkipFinalBackup = "kvcluster.io/skip-final-backup"
	// AnnotationAdoptVolumes: "true" lets a new KVCluster start its members on data claims that
	// exist already and were not made for it (e.g. retained from a deleted cluster of the same
	// name). Never with spec.restore: a restore starts on empty volumes only.
	AnnotationAdoptVolumes = "kvcluster.io/adopt-volumes"
	// AnnotationRotateCA: a new value (any token, e.g. a date) makes the operator replace the
	// cluster's CA (tls.mode Operator) with overlap: members trust old and new, certificates are
	// issued anew, then the old CA is dropped; members restart twice, one at a time.
	AnnotationRotateCA = "kvcluster.io/rotate-ca"
	// AnnotationBackupNow: a new value (any token of at most 63 characters, e.g. a date) takes one
	// backup now, through the same Job path as scheduled ones, into spec.backup; status.backupRequest
	// follows it. A value already answered is never taken again, and the backup waits while
	// another one runs. Scheduled backups keep to their schedule.
	AnnotationBackupNow = "kvcluster.io/backup-now"
	// MaxBackupNowToken is the longest value of AnnotationBackupNow taken.
	MaxBackupNowToken = 63
	// AnnotationDefragmentNow: a new value (any token of at most 63 characters, e.g. a date)
	// defragments every member once now, one at a time, the followers first and the leader last,
	// whatever spec.space.defragmentation says; status.defragmentRequest follows it. It waits
	// while the cluster is not Ready, a member does not answer or a backup runs. Re-applying the
	// value status.defragmentRequest answered does nothing; a new value waits for a running
	// defragmentation to finish, and replaces one still pending.
	AnnotationDefragmentNow = "kvcluster.io/defragment-now"
	// FinalizerFinalBackup holds deletion until the final backup finished (or was given up).
	FinalizerFinalBackup = "kvcluster.io/final-backup"
)

// MemberStatus is what etcd reports about one member.
type MemberStatus struct {
	// Name of the member (the pod's name).
	Name string `json:"name"`
	// ID is etcd's member ID in hexadecimal.
	ID string `json:"id"`
	// Version is the etcd server version the member reports.
	// +optional
	Version string `json:"version,omitempty"`
	// Leader is true for the current raft leader.
	// +optional
	Leader bool `json:"leader,omitempty"`
	// Learner is true for a non-voting member that is catching up.
	// +optional
	Learner bool `json:"learner,omitempty"`
	// Healthy is true when the member answered a status request.
	// +optional
	Healthy bool `json:"healthy,omitempty"`
	// VolumeUID is the UID of the PersistentVolumeClaim the member's data was last seen healthy on.
	// A member whose pod comes back on a different (new, empty) claim has lost its data: the
	// operator removes it from etcd and adds it back as a learner.
	// +optional
	VolumeUID string `json:"volumeUID,omitempty"`
	// DBSize is the size of the member's database file, rounded up to a MiB: what etcd compares
	// with its quota (status.backendQuota). It shrinks only when the member is defragmented.
	// +optional
	DBSize *resource.Quantity `json:"dbSize,omitempty"`
	// DBSizeInUse is the part of the database holding data, rounded up to a MiB; the rest is free
	// pages that compaction left and defragmentation returns to the disk.
	// +optional
	DBSizeInUse *resource.Quantity `json:"dbSizeInUse,omitempty"`
	// Alarms etcd has raised for the member: NOSPACE (its database reached the quota: the whole
	// cluster refuses writes) or CORRUPT.
	// +optional
	// +listType=atomic
	Alarms []string `json:"alarms,omitempty"`
	// LastDefragmentTime is when the operator last defragmented the member, returning its free
	// pages to the disk (see the README's "Running out of space").
	// +optional
	LastDefragmentTime *metav1.MicroTime `json:"lastDefragmentTime,omitempty"`
}

// Compaction is a compaction of the cluster's history by the operator.
type Compaction struct {
	// Revision: every revision before it was compacted away (the latest value of every key is kept).
	Revision int64 `json:"revision"`
	// Time is when the compaction was done (to the microsecond: members are defragmented after it,
	// maybe within the same second).
	Time metav1.MicroTime `json:"time"`
	// DisarmedTime is when the operator disarmed the NOSPACE alarm after it: the defragmentations
	// the compaction started are over, and the next alarm starts with a compaction of its own.
	// +optional
	DisarmedTime *metav1.MicroTime `json:"disarmedTime,omitempty"`
}

// KVClusterStatus is the observed state of a KVCluster.
type KVClusterStatus struct {
	// ObservedGeneration is the metadata.generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase is the lifecycle state: Creating, Ready, Upgrading or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// ReadyPartitions is the number of members (of the first spec.partitions) whose pod runs, is
	// ready and is not being deleted.
	// +optional
	ReadyPartitions int32 `json:"readyPartitions,omitempty"`

	// CurrentVersion is the etcd version every member runs, as etcd itself reports it.
	// +optional
	CurrentVersion string `json:"currentVersion,omitempty"`

	// LastBackupTime is when the last successful backup completed.
	// +optional
	LastBackupTime *metav1.Time `json:"lastBackupTime,omitempty"`

	// NextBackupTime is the next slot of backupSchedule.
	// +optional
	NextBackupTime *metav1.Time `json:"nextBackupTime,omitempty"`

	// LastScheduledTime is the slot of the most recent scheduled backup started; a slot never runs twice.
	// +optional
	LastScheduledTime *metav1.Time `json:"lastScheduledTime,omitempty"`

	// LastBackup describes the most recently finished backup, successful or not.
	// +optional
	LastBackup *BackupRecord `json:"lastBackup,omitempty"`

	// BackupRequest is where the backup most recently asked for with kvcluster.io/backup-now stands.
	// +optional
	BackupRequest *BackupRequest `json:"backupRequest,omitempty"`

	// DefragmentRequest is where the defragmentation most recently asked for with
	// kvcluster.io/defragment-now stands.
	// +optional
	DefragmentRequest *DefragmentRequest `json:"defragmentRequest,omitempty"`

	// LastProgressTime is when the phase was entered or the number of ready members last changed;
	// the progress deadline counts from it.
	// +optional
	LastProgressTime *metav1.Time `json:"lastProgressTime,omitempty"`

	// ClientEndpoint is the URL clients use to reach the cluster from inside Kubernetes.
	// +optional
	ClientEndpoint string `json:"clientEndpoint,omitempty"`

	// BackendQuota is the size a member's database may reach before etcd raises the NOSPACE alarm
	// and the cluster refuses writes, as the members report it.
	// +optional
	BackendQuota *resource.Quantity `json:"backendQuota,omitempty"`

	// VolumeSize is the size every member's volume is known to have reached: storage.size once
	// each member's claim has it. The default backend quota is a share of it, so while volumes are
	// expanded the quota stays what the old ones hold.
	// +optional
	VolumeSize *resource.Quantity `json:"volumeSize,omitempty"`

	// LastCompaction is the operator's last compaction of the cluster's history, freeing space
	// under the NOSPACE alarm; members past the space-pressure mark are defragmented after it.
	// +optional
	LastCompaction *Compaction `json:"lastCompaction,omitempty"`

	// Members is what etcd reports about each member.
	// +optional
	// +listType=map
	// +listMapKey=name
	Members []MemberStatus `json:"members,omitempty"`

	// Deletion is where each deletion step stands, once the KVCluster is being deleted.
	// +optional
	// +listType=map
	// +listMapKey=name
	Deletion []DeletionStep `json:"deletion,omitempty"`

	// Certificates are the cluster's TLS certificates (spec.tls): when each expires and, for
	// those the operator issues, when it is renewed.
	// +optional
	// +listType=map
	// +listMapKey=name
	Certificates []CertificateStatus `json:"certificates,omitempty"`

	// Conditions: Ready, Reconciling and Stalled (kstatus), and BackupSucceeded once a backup
	// finished, the backup schedule is invalid, or a blocking final backup failed on deletion.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CertificateStatus is one of a cluster's TLS certificates.
type CertificateStatus struct {
	// Name is the part: ca, server, peer or client.
	Name string `json:"name"`
	// Secret holds it.
	Secret string `json:"secret"`
	// NotAfter is when it expires.
	NotAfter metav1.Time `json:"notAfter"`
	// RenewAt is when the operator issues it again (mode Operator; not for the CA).
	// +optional
	RenewAt *metav1.Time `json:"renewAt,omitempty"`
}

// KVCluster is an etcd-backed key-value cluster managed by kvcluster-operator.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=kvc,categories=all
// +kubebuilder:metadata:annotations="argocd.argoproj.io/sync-options=Delete=false"
// +kubebuilder:metadata:annotations="kustomize.toolkit.fluxcd.io/prune=disabled"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyPartitions`
// +kubebuilder:printcolumn:name="Partitions",type=integer,JSONPath=`.spec.partitions`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.currentVersion`
// +kubebuilder:printcolumn:name="Last Backup",type=date,JSONPath=`.status.lastBackupTime`
// +kubebuilder:printcolumn:name="Next Backup",type=string,JSONPath=`.status.nextBackupTime`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 52",message="metadata.name must be at most 52 characters (it prefixes the member pods' host names)"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS label: lower-case letters, digits and '-', starting with a letter (it becomes the members' host names)"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.spec.version) || self.spec.version == oldSelf.spec.version || !self.spec.version.matches('^[0-9]+\\\\.[0-9]+\\\\.[0-9]+$') || !oldSelf.spec.version.matches('^[0-9]+\\\\.[0-9]+\\\\.[0-9]+$') || (has(self.status) && has(self.status.currentVersion) && self.spec.version == self.status.currentVersion) || int(self.spec.version.split('.')[1]) > int(oldSelf.spec.version.split('.')[1]) || (int(self.spec.version.split('.')[1]) == int(oldSelf.spec.version.split('.')[1]) && int(self.spec.version.split('.')[2]) >= int(oldSelf.spec.version.split('.')[2]))",messageExpression="'spec.version cannot go down from ' + oldSelf.spec.version + ' to ' + self.spec.version + ': etcd does not support downgrades (only going back to status.currentVersion, while an upgrade has not finished, is allowed); restore a backup into a new KVCluster instead'"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.spec.version) || self.spec.version == oldSelf.spec.version || !self.spec.version.matches('^[0-9]+\\\\.[0-9]+\\\\.[0-9]+$') || !oldSelf.spec.version.matches('^[0-9]+\\\\.[0-9]+\\\\.[0-9]+$') || int(self.spec.version.split('.')[1]) <= int(oldSelf.spec.version.split('.')[1]) + 1",messageExpression="'spec.version cannot skip a minor version (' + oldSelf.spec.version + ' to ' + self.spec.version + '): upgrade one minor version at a time, e.g. 3.6 to 3.7, waiting for status.currentVersion between steps'"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.spec.version) || self.spec.version == oldSelf.spec.version || !self.spec.version.matches('^3\\\\.7\\\\.[0-9]+$') || !oldSelf.spec.version.matches('^3\\\\.6\\\\.[0-9]+$') || int(oldSelf.spec.version.split('.')[2]) >= 11",messageExpression="'spec.version cannot go from ' + oldSelf.spec.version + ' to ' + self.spec.version + ' directly: etcd requires 3.6.11 or later before 3.7; upgrade to the latest 3.6 release first'"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.spec.storage) || !has(oldSelf.spec.storage.size) || !has(self.spec.storage) || !has(self.spec.storage.size) || quantity(string(self.spec.storage.size)).compareTo(quantity(string(oldSelf.spec.storage.size))) >= 0 || (has(self.status) && has(self.status.volumeSize) && quantity(string(self.spec.storage.size)).compareTo(quantity(string(self.status.volumeSize))) >= 0)",messageExpression="'spec.storage.size cannot shrink from ' + string(oldSelf.spec.storage.size) + ' to ' + string(self.spec.storage.size) + ': volumes cannot shrink (going back to status.volumeSize, the size every member volume has, is allowed while a growth has not finished)'"
type KVCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec KVClusterSpec `json:"spec"`
	// +optional
	Status KVClusterStatus `json:"status,omitzero"`
}

// KVClusterList is a list of KVClusters.
//
// +kubebuilder:object:root=true
type KVClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KVCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&KVCluster{}, &KVClusterList{})
}
