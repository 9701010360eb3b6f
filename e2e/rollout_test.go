//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// writerReport is what the writer pod (e2e/writer) serves.
type writerReport struct {
	Acknowledged             int      `json:"acknowledged"`
	Failed                   int      `json:"failed"`
	Outages                  int      `json:"outages"`
	LongestUnavailableMillis int64    `json:"longestUnavailableMillis"`
	LongestUnavailableSince  string   `json:"longestUnavailableSince"`
	LastError                string   `json:"lastError"`
	Checked                  bool     `json:"checked"`
	Missing                  []string `json:"missing"`
	Present                  int      `json:"present"`
	Failures                 []struct {
		Sent   time.Time `json:"sent"`
		Failed time.Time `json:"failed"`
		Error  string    `json:"error"`
	} `json:"failures"`
}

// String says what the writer saw, with when its longest outage began (to match with events).
func (r writerReport) String() string {
	s := fmt.Sprintf("%d acknowledged, %d failed in %d outages, longest unavailability %d ms", r.Acknowledged, r.Failed, r.Outages, r.LongestUnavailableMillis)
	if r.LongestUnavailableSince != "" {
		s += " from " + r.LongestUnavailableSince
	}
	if r.LastError != "" {
		s += " (" + r.LastError + ")"
	}
	return s
}

// failuresSince lists the writer's failed writes from since on, a line each, to match with the
// cluster's events.
func (r writerReport) failuresSince(since time.Time) string {
	var lines []string
	for _, f := range r.Failures {
		if !f.Failed.Before(since) {
			lines = append(lines, fmt.Sprintf("sent %s, failed %s: %s", f.Sent.UTC().Format(time.StampMilli), f.Failed.UTC().Format(time.StampMilli), f.Error))
		}
	}
	return strings.Join(lines, "\n")
}

// startWriter runs the continuous writer against the cluster's client Service, with the
// cluster's client certificate when it has TLS. The certificate's Secret is mounted whether it
// exists or not, so a writer started on a plaintext cluster can move to TLS with it (/switch).
func startWriter(ctx context.Context, t testing.TB, cfg *envconf.Config, kvc *kvv1.KVCluster) {
	t.Helper()
	scheme := schemeOf(get(ctx, t, cfg, kvc))
	optional := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "writer", Namespace: kvc.Namespace},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "writer", Image: writerImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Args:         []string{"--tls-dir=/etc/etcd-tls", "--endpoints=" + clientService(kvc, scheme)},
				Ports:        []corev1.ContainerPort{{ContainerPort: 8080}},
				VolumeMounts: []corev1.VolumeMount{{Name: "etcd-tls", MountPath: "/etc/etcd-tls", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "etcd-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: kvc.Name + "-tls-client", Optional: &optional}}}},
		},
	}
	if err := cfg.Client().Resources().Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	err := wait.For(conditions.New(cfg.Client().Resources()).PodReady(pod), wait.WithTimeout(2*time.Minute), wait.WithInterval(time.Second))
	if err != nil {
		t.Fatalf("writer pod not ready: %v", err)
	}
	if err := wait.For(func(ctx context.Context) (bool, error) {
		return writerAsk(ctx, t, cfg, kvc, "report").Acknowledged > 0, nil
	}, wait.WithTimeout(time.Minute), wait.WithInterval(time.Second)); err != nil {
		t.Fatalf("the writer never wrote: %+v", writerAsk(ctx, t, cfg, kvc, "report"))
	}
}

// schemeOf is the scheme the cluster's clients use: what status.clientEndpoint says, else https
// with TLS (which new clusters have by default: deploy/default installs an admission policy).
func schemeOf(kvc *kvv1.KVCluster) string {
	if scheme, _, ok := strings.Cut(kvc.Status.ClientEndpoint, "://"); ok {
		return scheme
	}
	if kvc.Spec.TLS != nil && kvc.Spec.TLS.Mode != kvv1.TLSDisabled {
		return "https"
	}
	return "http"
}

// clientService is the URL of the cluster's client Service in scheme.
func clientService(kvc *kvv1.KVCluster, scheme string) string {
	return fmt.Sprintf("%s://%s-client.%s.svc:2379", scheme, kvc.Name, kvc.Namespace)
}

// writerAsk reads the writer's report through the API server's pod proxy (works on kind too).
func writerAsk(ctx context.Context, t testing.TB, cfg *envconf.Config, kvc *kvv1.KVCluster, what string, params ...string) writerReport {
	t.Helper()
	raw, err := writerGet(ctx, t, cfg, kvc, what, params...)
	if err != nil {
		t.Fatalf("ask the writer for /%s: %v: %s", what, err, raw)
	}
	var rep writerReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("writer report %q: %v", raw, err)
	}
	return rep
}

// memberPods maps each member pod's name to the pod (backup Jobs' pods, which share the cluster's
// labels, are not members).
func memberPods(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster) map[string]*corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := cfg.Client().Resources(kvc.Namespace).List(ctx, &pods, func(o *metav1.ListOptions) {
		o.LabelSelector = "app.kubernetes.io/instance=" + kvc.Name + "," + appsv1.StatefulSetRevisionLabel
	}); err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for i := range pods.Items {
		// A pod older than the cluster is a deleted namesake's, still being torn down by the kubelet.
		if pods.Items[i].CreationTimestamp.Before(&kvc.CreationTimestamp) {
			continue
		}
		out[pods.Items[i].Name] = &pods.Items[i]
	}
	return out
}

// stopWriter stops the writer, which then reads back every write it had acknowledged, and fails
// the test when one is missing (while says when, for the message); it returns the final report.
func stopWriter(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster, while string) writerReport {
	t.Helper()
	rep := writerAsk(ctx, t, cfg, kvc, "stop")
	t.Logf("writer final: %s; %d keys present", rep, rep.Present)
	if !rep.Checked || len(rep.Missing) > 0 {
		t.Errorf("acknowledged writes missing %s: %d (%v), checked: %t", while, len(rep.Missing), rep.Missing[:min(len(rep.Missing), 10)], rep.Checked)
	}
	return rep
}

// stuckMembers explains a membership change that did not finish: the namespace's events, what the
// operator did, and each member pod's state with the last lines its etcd wrote in this run and the
// one before (why it exited).
func stuckMembers(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster) string {
	t.Helper()
	events, _ := kubectl(cfg, "-n", kvc.Namespace, "get", "events", "--sort-by=.lastTimestamp")
	operator := operatorLogAbout(cfg, kvc.Namespace, 8*time.Minute)
	pods, _ := kubectl(cfg, "-n", kvc.Namespace, "get", "pods,pvc", "-o", "wide")
	out := fmt.Sprintf("events:\n%s\noperator, about this cluster:\n%s\n%s", events, strings.Join(operator, "\n"), pods)
	for _, name := range slices.Sorted(maps.Keys(memberPods(ctx, t, cfg, kvc))) {
		current, _ := kubectl(cfg, "-n", kvc.Namespace, "logs", name, "-c", "etcd", "--tail=20")
		previous, _ := kubectl(cfg, "-n", kvc.Namespace, "logs", name, "-c", "etcd", "--previous", "--tail=20")
		out += fmt.Sprintf("\n%s etcd:\n%s\n%s etcd, previous run:\n%s", name, current, name, previous)
	}
	return out
}

// logMemberWarnings logs the warnings and errors each member logged since it started (etcd logs
// JSON lines), the last ones of each: what a failed availability check needs to be explained.
func logMemberWarnings(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(memberPods(ctx, t, cfg, kvc))) {
		logs, _ := kubectl(cfg, "-n", kvc.Namespace, "logs", name, "-c", "etcd")
		var warnings []string
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
				warnings = append(warnings, line)
			}
		}
		t.Logf("%s warned %d times since it started; the last ones:\n%s", name, len(warnings), strings.Join(warnings[max(len(warnings)-15, 0):], "\n"))
	}
}

func votingMembers(k *kvv1.KVCluster) (voting, learners int, leader string) {
	for _, m := range k.Status.Members {
		if m.Learner {
			learners++
			continue
		}
		voting++
		if m.Leader {
			leader = m.Name
		}
	}
	return voting, learners, leader
}

// readyWith is true when the cluster is Ready for its current generation with n healthy voting members.
func readyWith(k *kvv1.KVCluster, n int) bool {
	voting, learners, _ := votingMembers(k)
	return k.Status.ObservedGeneration == k.Generation && meta.IsStatusConditionTrue(k.Status.Conditions, kvv1.ConditionReady) &&
		voting == n && learners == 0
}

func TestUpgradeScaleAndHealUnderWrites(t *testing.T) {
	var kvc *kvv1.KVCluster
	f := features.New("a cluster under continuous writes is upgraded, scaled and healed without losing a write").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			// Backups go to a claim, so the upgrade takes its pre-upgrade backup through a real Job.
			ns := namespaceWithBackupClaim(ctx, t, cfg, "kvc-roll", "backups", "256Mi")
			kvc = &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "roll", Namespace: ns},
				Spec: kvv1.KVClusterSpec{Version: "3.6.16", Partitions: 3,
					Backup: &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backups"}, FinalBackup: kvv1.FinalBackupSkip}}}
			if err := cfg.Client().Resources().Create(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			waitReady(ctx, t, cfg, kvc, 5*time.Minute)
			startWriter(ctx, t, cfg, kvc)
			return ctx
		}).
		Assess("upgrade 3.6.16 → 3.7.3: one member down at most, the leader's pod last", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			before := get(ctx, t, cfg, kvc)
			_, _, leader := votingMembers(before)
			uids := map[string]types.UID{}
			for name, p := range memberPods(ctx, t, cfg, kvc) {
				uids[name] = p.UID
			}
			editSpec(ctx, t, cfg, kvc, func(k *kvv1.KVCluster) { k.Spec.Version = "3.7.3" })
			start := time.Now()
			var replaced []string
			maxDown, phases := 0, []kvv1.Phase{}
			err := wait.For(func(ctx context.Context) (bool, error) {
				down := 0
				pods := memberPods(ctx, t, cfg, kvc)
				for _, name := range []string{"roll-0", "roll-1", "roll-2"} {
					p, ok := pods[name]
					if !ok || p.DeletionTimestamp != nil || !isPodReady(p) {
						down++
					}
					if ok && p.UID != uids[name] && !slices.Contains(replaced, name) {
						replaced = append(replaced, name)
					}
				}
				maxDown = max(maxDown, down)
				k := get(ctx, t, cfg, kvc)
				if len(phases) == 0 || phases[len(phases)-1] != k.Status.Phase {
					phases = append(phases, k.Status.Phase)
				}
				return k.Status.CurrentVersion == "3.7.3" && readyWith(k, 3), nil
			}, wait.WithTimeout(8*time.Minute), wait.WithInterval(300*time.Millisecond))
			after := get(ctx, t, cfg, kvc)
			if err != nil {
				t.Fatalf("upgrade did not finish: %v; status %+v", err, after.Status)
			}
			rep := writerAsk(ctx, t, cfg, kvc, "report")
			t.Logf("upgrade took %s; pods replaced in order %v (leader before: %s); phases %v; at most %d member(s) down; writer: %d acknowledged, %d failed, longest unavailability %d ms (%s)",
				time.Since(start).Round(time.Second), replaced, leader, phases, maxDown, rep.Acknowledged, rep.Failed, rep.LongestUnavailableMillis, rep.LastError)
			if maxDown > 1 {
				t.Errorf("%d members were down at once during the upgrade", maxDown)
			}
			if len(replaced) != 3 || replaced[2] != leader {
				t.Errorf("pods replaced in order %v; want all three, the leader (%s) last", replaced, leader)
			}
			if !slices.Contains(phases, kvv1.PhaseUpgrading) {
				t.Errorf("phases seen %v, want Upgrading", phases)
			}
			for _, m := range after.Status.Members {
				if m.Version != "3.7.3" {
					t.Errorf("member %s reports %s", m.Name, m.Version)
				}
			}
			// The backup taken before any member restarted, on 3.6.16.
			if lb := after.Status.LastBackup; lb == nil || lb.Job != "roll-preupgrade" || !lb.Succeeded || !strings.HasPrefix(lb.EtcdVersion, "3.6.") {
				t.Errorf("lastBackup = %+v, want the pre-upgrade backup, of 3.6 data", lb)
			} else {
				t.Logf("pre-upgrade backup: %s, %d bytes, revision %d", lb.Location, lb.Size, lb.Revision)
			}
			events, _ := kubectl(cfg, "-n", kvc.Namespace, "get", "events", "--field-selector", "involvedObject.kind=KVCluster", "-o", "custom-columns=REASON:.reason,MESSAGE:.note")
			if !strings.Contains(events, "LeaderMoved") {
				t.Errorf("no LeaderMoved event:\n%s", events)
			}
			// One event per member restarted, not one series showing the first member only.
			for _, name := range []string{"roll-0", "roll-1", "roll-2"} {
				if !slices.ContainsFunc(timeline(ctx, t, cfg, kvc.Namespace, kvc.Name), func(e string) bool {
					return strings.HasPrefix(e, "MemberRestarted: ") && strings.Contains(e, name)
				}) {
					t.Errorf("no MemberRestarted event for %s:\n%s", name, events)
				}
			}
			// A node drain may take one of three members, with the pre-upgrade backup's pod still
			// there (a Job's pod counted as a member made the budget allow nothing).
			pdb := &policyv1.PodDisruptionBudget{}
			if err := wait.For(func(ctx context.Context) (bool, error) {
				err := cfg.Client().Resources().Get(ctx, kvc.Name, kvc.Namespace, pdb)
				return err == nil && pdb.Status.DisruptionsAllowed == 1, nil
			}, wait.WithTimeout(time.Minute), wait.WithInterval(2*time.Second)); err != nil {
				t.Errorf("the PodDisruptionBudget allows %d disruptions, want 1: %+v", pdb.Status.DisruptionsAllowed, pdb.Status.Conditions)
			}
			return ctx
		}).
		Assess("scale 3 → 5 → 3: learners join one at a time, members leave before their pods", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			for _, n := range []int{5, 3} {
				editSpec(ctx, t, cfg, kvc, func(k *kvv1.KVCluster) { k.Spec.Partitions = int32(n) })
				start := time.Now()
				sizes, violations := []string{}, []string{}
				err := wait.For(func(ctx context.Context) (bool, error) {
					k := get(ctx, t, cfg, kvc)
					voting, learners, leader := votingMembers(k)
					size := fmt.Sprintf("%d+%dL", voting, learners)
					if len(sizes) == 0 || sizes[len(sizes)-1] != size {
						sizes = append(sizes, size)
					}
					if voting < 3 || learners > 1 || leader == "" {
						violations = append(violations, fmt.Sprintf("%s (leader %q)", size, leader))
					}
					return readyWith(k, n), nil
				}, wait.WithTimeout(6*time.Minute), wait.WithInterval(300*time.Millisecond))
				if err != nil {
					t.Fatalf("scaling to %d did not finish: %v; status %+v\n%s", n, err, get(ctx, t, cfg, kvc).Status, stuckMembers(ctx, t, cfg, kvc))
				}
				if len(violations) > 0 {
					t.Errorf("while scaling to %d, etcd had fewer than 3 voting members, more than one learner, or no leader: %v", n, slices.Compact(violations))
				}
				rep := writerAsk(ctx, t, cfg, kvc, "report")
				t.Logf("scaled to %d in %s; voting+learners went %v; writer: %d acknowledged, %d failed, longest unavailability %d ms",
					n, time.Since(start).Round(time.Second), sizes, rep.Acknowledged, rep.Failed, rep.LongestUnavailableMillis)
				// Removed members' pods go after they left etcd.
				if err := wait.For(func(ctx context.Context) (bool, error) {
					return len(memberPods(ctx, t, cfg, kvc)) == n, nil
				}, wait.WithTimeout(2*time.Minute), wait.WithInterval(time.Second)); err != nil {
					t.Errorf("%d member pods after scaling to %d", len(memberPods(ctx, t, cfg, kvc)), n)
				}
			}
			// The scaled-away members' volumes are deleted (a re-added member must start empty).
			err := wait.For(func(ctx context.Context) (bool, error) {
				for _, name := range []string{"data-roll-3", "data-roll-4"} {
					err := cfg.Client().Resources().Get(ctx, name, kvc.Namespace, &corev1.PersistentVolumeClaim{})
					if !apierrors.IsNotFound(err) {
						return false, nil
					}
				}
				return true, nil
			}, wait.WithTimeout(time.Minute), wait.WithInterval(time.Second))
			if err != nil {
				t.Errorf("the volumes of removed members remain: %v", err)
			}
			return ctx
		}).
		Assess("a member whose pod and volume are deleted comes back as a new member", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			before := get(ctx, t, cfg, kvc)
			oldID := ""
			for _, m := range before.Status.Members {
				if m.Name == "roll-1" {
					oldID = m.ID
				}
			}
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-roll-1", Namespace: kvc.Namespace}}
			if err := cfg.Client().Resources().Delete(ctx, pvc); err != nil {
				t.Fatal(err)
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "roll-1", Namespace: kvc.Namespace}}
			if err := cfg.Client().Resources().Delete(ctx, pod); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			// Healed in 10-20 s in CI. Without the operator's awaited-pods nudge the StatefulSet
			// controller, backing off from 'pvc is being deleted', made the pod minutes late.
			err := wait.For(func(ctx context.Context) (bool, error) {
				k := get(ctx, t, cfg, kvc)
				for _, m := range k.Status.Members {
					if m.Name == "roll-1" && m.ID != oldID && !m.Learner && m.Healthy {
						return readyWith(k, 3), nil
					}
				}
				return false, nil
			}, wait.WithTimeout(2*time.Minute), wait.WithInterval(time.Second))
			if err != nil {
				t.Fatalf("the member did not come back within 2 minutes: %v; status %+v\n%s", err, get(ctx, t, cfg, kvc).Status, stuckMembers(ctx, t, cfg, kvc))
			}
			rep := writerAsk(ctx, t, cfg, kvc, "report")
			t.Logf("healed in %s (member roll-1 was %s, now %s); writer: %d acknowledged, %d failed, longest unavailability %d ms",
				time.Since(start).Round(time.Second), oldID, memberID(get(ctx, t, cfg, kvc), "roll-1"), rep.Acknowledged, rep.Failed, rep.LongestUnavailableMillis)
			return ctx
		}).
		Assess("every acknowledged write is still there", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			rep := stopWriter(ctx, t, cfg, kvc, "after the upgrade, scaling and healing")
			if rep.Acknowledged < 100 {
				t.Errorf("only %d writes acknowledged: the writer did not really write", rep.Acknowledged)
			}
			return ctx
		}).
		Teardown(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			_ = cfg.Client().Resources().Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvc.Namespace}})
			return ctx
		}).Feature()
	testAlongsideOthers(t, f)
}

func memberID(k *kvv1.KVCluster, name string) string {
	for _, m := range k.Status.Members {
		if m.Name == name {
			return m.ID
		}
	}
	return ""
}
