package specs

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

func cluster(partitions int32) *kvv1.KVCluster {
	return &kvv1.KVCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "kv", Namespace: "prod", UID: "uid-1",
			Labels: map[string]string{"argocd.argoproj.io/instance": "app"}},
		Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: partitions},
	}
}

func TestInitialCluster(t *testing.T) {
	tests := []struct {
		partitions int32
		want       string
	}{
		{1, "kv-0=http://kv-0.kv-peer.prod.svc:2380"},
		{3, "kv-0=http://kv-0.kv-peer.prod.svc:2380,kv-1=http://kv-1.kv-peer.prod.svc:2380,kv-2=http://kv-2.kv-peer.prod.svc:2380"},
	}
	for _, tt := range tests {
		if got := InitialCluster(cluster(tt.partitions)); got != tt.want {
			t.Errorf("InitialCluster(%d) = %q, want %q", tt.partitions, got, tt.want)
		}
	}
}

func TestMemberClientURLs(t *testing.T) {
	got := MemberClientURLs(cluster(3), "http")
	want := []string{"http://kv-0.kv-peer.prod.svc:2379", "http://kv-1.kv-peer.prod.svc:2379", "http://kv-2.kv-peer.prod.svc:2379"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("MemberClientURLs = %v, want %v", got, want)
	}
	if e := ClientEndpoint(cluster(3), "http"); e != "http://kv-client.prod.svc:2379" {
		t.Errorf("ClientEndpoint = %q", e)
	}
}

func TestPodDisruptionBudgetKeepsQuorum(t *testing.T) {
	tests := []struct{ partitions, quorum, maxUnavailable int32 }{
		{1, 1, 0}, {2, 2, 0}, {3, 2, 1}, {4, 3, 1}, {5, 3, 2}, {7, 4, 3}, {9, 5, 4},
	}
	for _, tt := range tests {
		if q := Quorum(tt.partitions); q != tt.quorum {
			t.Errorf("Quorum(%d) = %d, want %d", tt.partitions, q, tt.quorum)
		}
		pdb := PodDisruptionBudget(cluster(9), tt.partitions)
		if got := pdb.Spec.MaxUnavailable.IntValue(); int32(got) != tt.maxUnavailable {
			t.Errorf("%d voting members: maxUnavailable = %d, want %d", tt.partitions, got, tt.maxUnavailable)
		}
		if pdb.Spec.Selector.MatchLabels["app.kubernetes.io/instance"] != "kv" {
			t.Errorf("PDB selector = %v", pdb.Spec.Selector.MatchLabels)
		}
	}
}

// TestSpaceFlags: the quota is spec.space.backendQuota, else half of what the volume holds beside
// the WAL (at most 8 GiB), never more than that nor less than 16 MiB; the WAL is kept to four
// segments; auto-compaction keeps an hour of history unless the spec says otherwise.
func TestSpaceFlags(t *testing.T) {
	holds := func(size int64) int64 { return size*85/100 - 256_000_000 } // beside the WAL
	tests := []struct {
		name, size, quota string
		volume            string // the size the members' volumes have reached, when not storage.size
		compaction        kvv1.AutoCompactionSpec
		want              string
	}{
		{name: "defaults: half of what 1Gi holds, an hour", size: "1Gi",
			want: fmt.Sprintf("--quota-backend-bytes=%d --auto-compaction-mode=periodic --auto-compaction-retention=1h", holds(1<<30)/2)},
		{name: "half of what the smallest volume holds", size: "512Mi", want: fmt.Sprintf("--quota-backend-bytes=%d", holds(512<<20)/2)},
		{name: "capped at etcd's recommended maximum", size: "100Gi", want: fmt.Sprintf("--quota-backend-bytes=%d", 8<<30)},
		{name: "the spec's quota", size: "512Mi", quota: "24Mi", want: fmt.Sprintf("--quota-backend-bytes=%d", 24<<20)},
		{name: "the spec's quota, up to what the volume holds", size: "1Gi", quota: "600Mi", want: fmt.Sprintf("--quota-backend-bytes=%d", 600<<20)},
		{name: "the default of the volumes while they grow", size: "2Gi", volume: "1Gi", want: fmt.Sprintf("--quota-backend-bytes=%d", holds(1<<30)/2)},
		{name: "a raised quota waits for the volumes", size: "2Gi", volume: "1Gi", quota: "1400Mi", want: fmt.Sprintf("--quota-backend-bytes=%d", holds(1<<30))},
		{name: "a quota the volumes hold already", size: "2Gi", volume: "1Gi", quota: "500Mi", want: fmt.Sprintf("--quota-backend-bytes=%d", 500<<20)},
		{name: "a volume smaller than admission allows (an earlier release's) gets the least quota", size: "64Mi", want: fmt.Sprintf("--quota-backend-bytes=%d", 16<<20)},
		{name: "the WAL kept to four segments", size: "1Gi", want: "--snapshot-count=78 --max-wals=3"},
		{name: "periodic, the spec's retention", size: "1Gi", compaction: kvv1.AutoCompactionSpec{Mode: kvv1.AutoCompactionPeriodic, Retention: "30m"},
			want: "--auto-compaction-mode=periodic --auto-compaction-retention=30m"},
		{name: "by revision, default retention", size: "1Gi", compaction: kvv1.AutoCompactionSpec{Mode: kvv1.AutoCompactionRevision},
			want: "--auto-compaction-mode=revision --auto-compaction-retention=10000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "kv", Namespace: "ns"}}
			kvc.Spec.Storage.Size = resource.MustParse(tt.size)
			if tt.quota != "" {
				q := resource.MustParse(tt.quota)
				kvc.Spec.Space.BackendQuota = &q
			}
			kvc.Spec.Space.AutoCompaction = tt.compaction
			var volume resource.Quantity
			if tt.volume != "" {
				volume = resource.MustParse(tt.volume)
			}
			if args := strings.Join(EtcdArgs(kvc, DesiredTransport(kvc), QuotaBackendBytes(kvc, volume)), " "); !strings.Contains(args, tt.want+" ") && !strings.HasSuffix(args, tt.want) {
				t.Errorf("etcd args %q lack %q", args, tt.want)
			}
		})
	}
}

func TestImage(t *testing.T) {
	tests := []struct {
		name, specRepo, flagRepo, want string
	}{
		{"official by default", "", "", "gcr.io/etcd-development/etcd:v3.7.3"},
		{"operator flag (mirror)", "", "mirror.example/etcd", "mirror.example/etcd:v3.7.3"},
		{"cluster's own repository wins", "team.example/etcd", "mirror.example/etcd", "team.example/etcd:v3.7.3"},
	}
	for _, tt := range tests {
		kvc := cluster(3)
		kvc.Spec.Repository = tt.specRepo
		if got := Image(kvc, tt.flagRepo); got != tt.want {
			t.Errorf("%s: Image = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestServices(t *testing.T) {
	kvc := cluster(3)
	peer := PeerService(kvc, "")
	if *peer.Name != "kv-peer" || *peer.Spec.ClusterIP != corev1.ClusterIPNone || !*peer.Spec.PublishNotReadyAddresses {
		t.Errorf("peer Service must be headless and publish not-ready addresses: %+v", peer.Spec)
	}
	if len(peer.Spec.Ports) != 2 || *peer.Spec.Ports[1].Port != PeerPort {
		t.Errorf("peer Service ports = %+v", peer.Spec.Ports)
	}
	cl := ClientService(kvc, time.Time{})
	if *cl.Name != "kv-client" || *cl.Spec.Type != corev1.ServiceTypeClusterIP || cl.Spec.PublishNotReadyAddresses != nil {
		t.Errorf("client Service must be a ClusterIP over ready members only: %+v", cl.Spec)
	}
	if cl.Spec.Selector["app.kubernetes.io/instance"] != "kv" {
		t.Errorf("client Service selector = %v", cl.Spec.Selector)
	}
	drained := ClientService(kvc, time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	if _, matchesMembers := drained.Spec.Selector[drainedLabel]; !matchesMembers || drained.Spec.Selector["app.kubernetes.io/instance"] != "kv" ||
		drained.Annotations[DrainedAtAnnotation] != "2026-11-30T10:00:00Z" {
		t.Errorf("a drained client Service must select no member and say since when: %v %v", drained.Spec.Selector, drained.Annotations)
	}
}

// TestTheGuardOwnsWhatTheDeletionStepsNeed: while a cluster has deletion steps, what they need has
// the guard as a second owner (it keeps the garbage collector from deleting it during a
// foreground deletion); the rest, and everything when there is no guard, only the KVCluster.
func TestTheGuardOwnsWhatTheDeletionStepsNeed(t *testing.T) {
	kvc := cluster(3)
	kvc.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "b"}}
	kvc.Spec.Deregistration = &kvv1.DeregistrationSpec{Job: &kvv1.JobDeregistration{Image: "i"}}
	guarded := map[string][]metav1ac.OwnerReferenceApplyConfiguration{
		"StatefulSet":  StatefulSet(kvc, MemberSet{Replicas: 3, Guard: "guard-1"}).OwnerReferences,
		"peer Service": PeerService(kvc, "guard-1").OwnerReferences,
		"ConfigMap":    MembershipConfigMap(kvc, NewClusterMembership(kvc), "guard-1").OwnerReferences,
		"final backup": BackupJob(kvc, BackupRun{Job: "kv-final", Kind: BackupFinal, Key: "k", Guard: "guard-1"}, "op:1").OwnerReferences,
		"deregister":   DeregistrationJob(kvc, "op:1", "guard-1").OwnerReferences,
	}
	for what, refs := range guarded {
		if len(refs) != 2 || *refs[0].UID != "uid-1" || !*refs[0].Controller || *refs[1].UID != "guard-1" || *refs[1].Name != "kv-guard" ||
			refs[1].Controller != nil || refs[1].BlockOwnerDeletion != nil {
			t.Errorf("%s owners = %q, want the KVCluster (controller) and the guard", what, ownerFacts(refs))
		}
	}
	for what, refs := range map[string][]metav1ac.OwnerReferenceApplyConfiguration{
		"client Service": ClientService(kvc, time.Time{}).OwnerReferences,
		"PDB":            PodDisruptionBudget(kvc, 3).OwnerReferences,
		"no guard":       StatefulSet(kvc, MemberSet{Replicas: 3}).OwnerReferences,
	} {
		if len(refs) != 1 || *refs[0].UID != "uid-1" {
			t.Errorf("%s owners = %q, want only the KVCluster", what, ownerFacts(refs))
		}
	}
	if g := Guard(kvc); len(g.OwnerReferences) != 0 || g.Labels[ClusterUIDLabel] != "uid-1" || g.Labels[ManagedByLabel] != ManagedByValue {
		t.Errorf("the guard must have no owner and name its cluster: %+v", g.ObjectMetaApplyConfiguration)
	}
}

// jobFacts is what a user observes of a Job with one container (kubectl get job -o yaml), in
// plain values, so a test states the whole of it and a difference names the field.
type jobFacts struct {
	Name, Namespace    string
	Labels, PodLabels  map[string]string
	Annotations        map[string]string
	Owners             []string
	Deadline, Backoff  int64
	RestartPolicy      corev1.RestartPolicy
	AutomountToken     bool
	Image              string
	Command, Args, Env []string
	Volumes, Mounts    []string
	TerminationMessage corev1.TerminationMessagePolicy
}

func factsOf(t *testing.T, job *batchv1ac.JobApplyConfiguration) jobFacts {
	t.Helper()
	pod := job.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("Job %s has %d containers, want 1", *job.Name, len(pod.Containers))
	}
	c := pod.Containers[0]
	f := jobFacts{
		Name: *job.Name, Namespace: *job.Namespace,
		Labels: job.Labels, PodLabels: job.Spec.Template.Labels,
		Owners:   ownerFacts(job.OwnerReferences),
		Deadline: *job.Spec.ActiveDeadlineSeconds, Backoff: int64(*job.Spec.BackoffLimit),
		RestartPolicy: *pod.RestartPolicy, AutomountToken: *pod.AutomountServiceAccountToken,
		Image: *c.Image, Command: c.Command, Args: c.Args,
		TerminationMessage: *c.TerminationMessagePolicy,
	}
	if len(job.Annotations) > 0 {
		f.Annotations = job.Annotations
	}
	for _, e := range c.Env {
		f.Env = append(f.Env, envFact(e))
	}
	for _, v := range pod.Volumes {
		f.Volumes = append(f.Volumes, fmt.Sprintf("%s: claim %s readOnly=%t", *v.Name, *v.PersistentVolumeClaim.ClaimName, *v.PersistentVolumeClaim.ReadOnly))
	}
	for _, m := range c.VolumeMounts {
		f.Mounts = append(f.Mounts, fmt.Sprintf("%s at %s readOnly=%t", *m.Name, *m.MountPath, m.ReadOnly != nil && *m.ReadOnly))
	}
	return f
}

// ownerFacts spells owner references as "apiVersion Kind/name uid=… controller=… blockOwnerDeletion=…".
func ownerFacts(refs []metav1ac.OwnerReferenceApplyConfiguration) []string {
	var out []string
	for _, r := range refs {
		out = append(out, fmt.Sprintf("%s %s/%s uid=%s controller=%t blockOwnerDeletion=%t",
			*r.APIVersion, *r.Kind, *r.Name, *r.UID, r.Controller != nil && *r.Controller, r.BlockOwnerDeletion != nil && *r.BlockOwnerDeletion))
	}
	return out
}

// envFact spells an environment variable as NAME=value, or where its value comes from.
func envFact(e corev1ac.EnvVarApplyConfiguration) string {
	switch {
	case e.Value != nil:
		return *e.Name + "=" + *e.Value
	case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
		return fmt.Sprintf("%s from Secret %s key %s", *e.Name, *e.ValueFrom.SecretKeyRef.Name, *e.ValueFrom.SecretKeyRef.Key)
	}
	return *e.Name + " from elsewhere"
}

// compareFacts reports each field of got that differs from want.
func compareFacts(t *testing.T, got, want jobFacts) {
	t.Helper()
	g, w := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range g.NumField() {
		if gf, wf := g.Field(i).Interface(), w.Field(i).Interface(); !reflect.DeepEqual(gf, wf) {
			t.Errorf("%s:\n got %#v\nwant %#v", g.Type().Field(i).Name, gf, wf)
		}
	}
}

func TestStatefulSet(t *testing.T) {
	kvc := cluster(3)
	kvc.Spec.Storage = kvv1.StorageSpec{Size: resource.MustParse("2Gi"), StorageClassName: "fast"}
	kvc.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}
	sts := StatefulSet(kvc, MemberSet{Replicas: 3})
	spec := sts.Spec
	if got := spec.VolumeClaimTemplates[0].Labels[ClusterUIDLabel]; got != "uid-1" {
		t.Errorf("claims are labelled with cluster UID %q, want uid-1: a re-created cluster must recognise leftovers", got)
	}
	legacy := StatefulSet(kvc, MemberSet{Replicas: 3, UnlabelledClaims: true})
	if _, ok := legacy.Spec.VolumeClaimTemplates[0].Labels[ClusterUIDLabel]; ok {
		t.Error("the claim template of an earlier release's StatefulSet cannot change")
	}

	if *spec.Replicas != 3 || *spec.ServiceName != "kv-peer" {
		t.Errorf("replicas/serviceName = %d/%s", *spec.Replicas, *spec.ServiceName)
	}
	if *spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("updateStrategy = %s, want OnDelete (the operator orders member restarts)", *spec.UpdateStrategy.Type)
	}
	if *spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy = %s, want Parallel (bootstrap needs all members)", *spec.PodManagementPolicy)
	}
	ref := sts.OwnerReferences[0]
	if *ref.Kind != "KVCluster" || !*ref.Controller || *ref.UID != "uid-1" {
		t.Errorf("owner reference = %+v", ref)
	}
	if _, copied := sts.Labels["argocd.argoproj.io/instance"]; copied {
		t.Error("the KVCluster's own labels must not be copied to children (GitOps tracking)")
	}
	if sts.Labels[ManagedByLabel] != ManagedByValue {
		t.Errorf("labels = %v, want %s=%s for the operator's cache", sts.Labels, ManagedByLabel, ManagedByValue)
	}

	pod := spec.Template.Spec
	if pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		*pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context not restricted: %+v", pod.SecurityContext)
	}
	c := pod.Containers[0]
	if *c.Image != "gcr.io/etcd-development/etcd:v3.7.3" || *c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image = %s (%s)", *c.Image, *c.ImagePullPolicy)
	}
	sc := c.SecurityContext
	if *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container security context not restricted: %+v", sc)
	}
	if *c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.ReadinessProbe.HTTPGet.Port.String() != "metrics" ||
		*c.LivenessProbe.HTTPGet.Path != "/livez" {
		t.Errorf("probes must use /readyz and /livez on the metrics port: %+v %+v", c.ReadinessProbe.HTTPGet, c.LivenessProbe.HTTPGet)
	}
	if c.Resources.Requests.Cpu().String() != "100m" {
		t.Errorf("resources = %+v", c.Resources)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{
		"--initial-advertise-peer-urls=http://$(POD_NAME).kv-peer.prod.svc:2380",
		"--listen-metrics-urls=http://0.0.0.0:2381",
		"--data-dir=/var/lib/etcd/data",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("etcd args lack %q: %s", want, args)
		}
	}
	if strings.Contains(args, "--experimental") {
		t.Errorf("etcd 3.7 refuses --experimental-* flags: %s", args)
	}
	// The initial cluster changes with the membership, so it must come from the ConfigMap (read
	// when the container starts), not from the template (a change would make every pod outdated).
	if strings.Contains(args, "--initial-cluster=") || strings.Contains(args, "--initial-cluster-state") {
		t.Errorf("the initial cluster must not be a flag: %s", args)
	}
	fromConfigMap := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
			fromConfigMap[*e.Name] = *e.ValueFrom.ConfigMapKeyRef.Name + "/" + *e.ValueFrom.ConfigMapKeyRef.Key
		}
	}
	if fromConfigMap["ETCD_INITIAL_CLUSTER"] != "kv-members/initial-cluster" || fromConfigMap["ETCD_INITIAL_CLUSTER_STATE"] != "kv-members/initial-cluster-state" {
		t.Errorf("etcd env from the membership ConfigMap = %v", fromConfigMap)
	}

	pvc := spec.VolumeClaimTemplates[0]
	if *pvc.Name != "data" || *pvc.Spec.StorageClassName != "fast" ||
		pvc.Spec.Resources.Requests.Storage().String() != "2Gi" {
		t.Errorf("volume claim template = %+v", pvc.Spec)
	}
	if pvc.Namespace != nil {
		t.Errorf("volume claim template must not set a namespace")
	}
}

// TestStatefulSetKeepsItsClaimSize: a StatefulSet's claim templates cannot change, so a grown
// storage.size leaves the template at the size it was made with (the operator expands the
// claims); the quota is the one planned for the volumes the members have.
func TestStatefulSetKeepsItsClaimSize(t *testing.T) {
	kvc := cluster(3)
	kvc.Spec.Storage.Size = resource.MustParse("2Gi")
	sts := StatefulSet(kvc, MemberSet{Replicas: 3, ClaimSize: resource.MustParse("1Gi"), Quota: 100 << 20})
	if got := sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String(); got != "1Gi" {
		t.Errorf("claim template asks for %s, want the 1Gi it was made with", got)
	}
	if args := strings.Join(sts.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, fmt.Sprintf("--quota-backend-bytes=%d ", 100<<20)) {
		t.Errorf("members must run with the quota planned for the volumes they have: %s", args)
	}
}

func TestStatefulSetDefaultsStorage(t *testing.T) {
	sts := StatefulSet(cluster(1), MemberSet{Replicas: 1})
	pvc := sts.Spec.VolumeClaimTemplates[0]
	if pvc.Spec.StorageClassName != nil {
		t.Errorf("an empty storageClassName must use the cluster default, got %q", *pvc.Spec.StorageClassName)
	}
	if got := pvc.Spec.Resources.Requests.Storage().String(); got != "1Gi" {
		t.Errorf("default size = %s, want 1Gi", got)
	}
}

func TestStatefulSetRestoresFromABackup(t *testing.T) {
	kvc := cluster(3)
	if sts := StatefulSet(kvc, MemberSet{Images: Images{Operator: "op:1"}, Replicas: 3, Bootstrapping: true}); len(sts.Spec.Template.Spec.InitContainers) != 0 {
		t.Fatal("a cluster without spec.restore must not restore")
	}
	kvc.Spec.Restore = &kvv1.RestoreSpec{
		S3:     &kvv1.S3Destination{Endpoint: "s3:7070", Bucket: "b", Region: "us-east-1", Insecure: true, CredentialsSecret: "creds"},
		Key:    "team/prod/kv/kv-final.db",
		SHA256: strings.Repeat("0f", 32),
	}
	pod := StatefulSet(kvc, MemberSet{Images: Images{Operator: "op:1"}, Replicas: 3, Bootstrapping: true}).Spec.Template.Spec
	if len(pod.InitContainers) != 2 {
		t.Fatalf("init containers = %d, want fetch and apply", len(pod.InitContainers))
	}
	fetch, apply := pod.InitContainers[0], pod.InitContainers[1]
	if *fetch.Image != "op:1" || len(fetch.Env) != 4 || *fetch.Env[0].ValueFrom.SecretKeyRef.Name != "creds" {
		t.Errorf("fetch runs the operator image with the credentials: %s %+v", *fetch.Image, fetch.Env)
	}
	fetchArgs := strings.Join(fetch.Args, " ")
	for _, want := range []string{"--key=team/prod/kv/kv-final.db", "--sha256=" + strings.Repeat("0f", 32), "--insecure", "--data-dir=/var/lib/etcd/data"} {
		if !strings.Contains(fetchArgs, want) {
			t.Errorf("fetch args lack %q: %s", want, fetchArgs)
		}
	}
	// With the workload's cloud identity, the fetch has no Secret: the ServiceAccount's role.
	kvc.Spec.Restore.S3 = &kvv1.S3Destination{Endpoint: "s3.eu-1.amazonaws.com", Bucket: "b", Region: "eu-1", WorkloadIdentity: true}
	kvc.Spec.Pods.ServiceAccountName = "restores"
	wi := StatefulSet(kvc, MemberSet{Images: Images{Operator: "op:1"}, Replicas: 3, Bootstrapping: true}).Spec.Template.Spec
	if f := wi.InitContainers[0]; len(f.Env) != 2 || !slices.Contains(f.Args, "--workload-identity") || *wi.ServiceAccountName != "restores" {
		t.Errorf("fetch with the workload's identity: env %+v, args %q, service account %v", f.Env, f.Args, wi.ServiceAccountName)
	}
	// The restore itself runs in the etcd image of the cluster's own version, without credentials,
	// and gives each member exactly the membership etcd will start with.
	if *apply.Image != "gcr.io/etcd-development/etcd:v3.7.3" || len(apply.Env) != 3 {
		t.Errorf("apply image %s env %+v", *apply.Image, apply.Env)
	}
	applyArgs := strings.Join(apply.Args, " ")
	// A member that joins the running cluster later (scale-up, replacement) must not restore.
	for _, args := range []string{fetchArgs, applyArgs} {
		if !strings.Contains(args, "--initial-cluster-state=$(ETCD_INITIAL_CLUSTER_STATE)") {
			t.Errorf("restore must skip members joining a running cluster: %s", args)
		}
	}
	if !strings.Contains(applyArgs, "--initial-cluster=$(ETCD_INITIAL_CLUSTER)") {
		t.Errorf("restore must use the membership etcd starts with: %s", applyArgs)
	}
	etcdArgs := strings.Join(EtcdArgs(kvc, DesiredTransport(kvc), 0), " ")
	for _, flag := range []string{"--initial-cluster-token=", "--initial-advertise-peer-urls="} {
		i := strings.Index(etcdArgs, flag)
		same := strings.Fields(etcdArgs[i:])[0]
		if !strings.Contains(applyArgs, same) {
			t.Errorf("restore uses a different %s than etcd: %s vs %s", flag, applyArgs, same)
		}
	}
	if len(pod.Volumes) != 1 || pod.Volumes[0].EmptyDir == nil {
		t.Errorf("the copied restore program needs a shared emptyDir: %+v", pod.Volumes)
	}
}

func TestBackupAndRestoreOnAPersistentVolumeClaim(t *testing.T) {
	kvc := cluster(1)
	kvc.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backup-volume", Prefix: "etcd"}}
	job := BackupJob(kvc, ScheduledBackupRun(kvc, "kv-7"), "op:1")
	pod := job.Spec.Template.Spec
	args := strings.Join(pod.Containers[0].Args, " ")
	if !strings.Contains(args, "--dir=/backups --claim=backup-volume") || !strings.Contains(args, "--key=etcd/prod/kv/uid-1/kv-7.db") || strings.Contains(args, "--s3") {
		t.Errorf("args = %s", args)
	}
	if len(pod.Containers[0].Env) != 0 {
		t.Errorf("a PVC destination needs no credentials: %+v", pod.Containers[0].Env)
	}
	if len(pod.Volumes) != 1 || *pod.Volumes[0].PersistentVolumeClaim.ClaimName != "backup-volume" || *pod.Containers[0].VolumeMounts[0].ReadOnly {
		t.Errorf("the claim must be mounted writable: %+v %+v", pod.Volumes, pod.Containers[0].VolumeMounts)
	}
	if pod.SecurityContext.FSGroup == nil {
		t.Error("fsGroup is needed to write to the claim as non-root")
	}

	kvc.Spec.Restore = &kvv1.RestoreSpec{PVC: &kvv1.PVCDestination{ClaimName: "backup-volume"}, Key: "etcd/prod/old/old-final.db"}
	sts := StatefulSet(kvc, MemberSet{Images: Images{Operator: "op:1"}, Replicas: 3, Bootstrapping: true}).Spec.Template.Spec
	fetch := sts.InitContainers[0]
	if len(sts.Volumes) != 2 || *sts.Volumes[1].PersistentVolumeClaim.ClaimName != "backup-volume" || !*sts.Volumes[1].PersistentVolumeClaim.ReadOnly {
		t.Errorf("the restore must mount the claim read-only: %+v", sts.Volumes)
	}
	if m := fetch.VolumeMounts[len(fetch.VolumeMounts)-1]; *m.MountPath != "/backups" || !*m.ReadOnly {
		t.Errorf("fetch mounts = %+v", fetch.VolumeMounts)
	}
}

func TestMembershipConfigMap(t *testing.T) {
	kvc := cluster(3)
	peer := func(i int) string { return fmt.Sprintf("kv-%d=http://kv-%d.kv-peer.prod.svc:2380", i, i) }
	tests := []struct {
		name        string
		membership  Membership
		wantCluster string
	}{
		{"a new cluster starts with all partitions", NewClusterMembership(kvc), peer(0) + "," + peer(1) + "," + peer(2)},
		{"a joining member gets the members etcd has", Membership{State: ClusterStateExisting, Ordinals: []int{0, 1, 2, 3}},
			peer(0) + "," + peer(1) + "," + peer(2) + "," + peer(3)},
		{"a replaced member's slot may be a hole", Membership{State: ClusterStateExisting, Ordinals: []int{0, 2}}, peer(0) + "," + peer(2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cm := MembershipConfigMap(kvc, tt.membership, "")
			if *cm.Name != "kv-members" || cm.Data["initial-cluster"] != tt.wantCluster || cm.Data["initial-cluster-state"] != tt.membership.State {
				t.Errorf("ConfigMap %s data = %v, want %s (%s)", *cm.Name, cm.Data, tt.wantCluster, tt.membership.State)
			}
			back, ok := ParseMembership(kvc, cm.Data)
			if !ok || back.State != tt.membership.State || fmt.Sprint(back.Ordinals) != fmt.Sprint(tt.membership.Ordinals) {
				t.Errorf("ParseMembership = %+v %t, want %+v", back, ok, tt.membership)
			}
		})
	}
	if _, ok := ParseMembership(kvc, map[string]string{"initial-cluster": peer(0), "initial-cluster-state": "bogus"}); ok {
		t.Error("an unknown state must not parse")
	}
}

func TestOrdinalOfPeerURL(t *testing.T) {
	kvc := cluster(3)
	tests := []struct {
		url  string
		want int
		ok   bool
	}{
		{"http://kv-0.kv-peer.prod.svc:2380", 0, true},
		{"http://kv-8.kv-peer.prod.svc:2380", 8, true},
		{"http://kv-12.kv-peer.prod.svc:2380", 0, false}, // no cluster has that many members
		{"http://kv-01.kv-peer.prod.svc:2380", 0, false},
		{"http://kv-1.kv-peer.other.svc:2380", 0, false},
		{"http://kvx-1.kv-peer.prod.svc:2380", 0, false},
		{"http://kv-1.kv-peer.prod.svc:2379", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := OrdinalOfPeerURL(kvc, tt.url)
		if got != tt.want || ok != tt.ok {
			t.Errorf("OrdinalOfPeerURL(%q) = %d, %t; want %d, %t", tt.url, got, ok, tt.want, tt.ok)
		}
	}
}
