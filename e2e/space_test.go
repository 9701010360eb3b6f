//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// fillReport is the writer's answer to /fill.
type fillReport struct {
	Puts    int    `json:"puts"`
	Last    string `json:"last"`
	Refused string `json:"refused"`
}

// eventsOf are the events of an object, oldest first.
func eventsOf(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, object string) []corev1.Event {
	t.Helper()
	var evs corev1.EventList
	if err := cfg.Client().Resources(ns).List(ctx, &evs); err != nil {
		t.Fatal(err)
	}
	evs.Items = slices.DeleteFunc(evs.Items, func(e corev1.Event) bool { return e.InvolvedObject.Name != object })
	slices.SortStableFunc(evs.Items, func(a, b corev1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
	return evs.Items
}

// timeline is the events of an object, oldest first, as "Reason: message" lines.
func timeline(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, object string) []string {
	t.Helper()
	var out []string
	for _, e := range eventsOf(ctx, t, cfg, ns, object) {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out
}

// defragmentation is one MemberDefragmented event of the operator's: the member, whether it led
// the cluster then, and when the operator defragmented it (the event's time less the time it says
// the member took).
type defragmentation struct {
	Member   string
	Leader   bool
	From, To time.Time
}

// defragmentedMessage is a MemberDefragmented event's message: "defragmented kv-2 (the leader)
// in 47ms in routine operation ...".
var defragmentedMessage = regexp.MustCompile(`^defragmented (\S+)( \(the leader\))? in (\S+) `)

// defragmentations are the cluster's MemberDefragmented events whose message contains why (the
// kind: "in routine operation", "under the NOSPACE alarm", "asked for with ...=token"), oldest
// first. Events are sent after the status a test waits for: they are awaited for a while, until
// there is one per member.
func defragmentations(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster, why string) []defragmentation {
	t.Helper()
	var out []defragmentation
	_ = wait.For(func(ctx context.Context) (bool, error) {
		out = nil
		for _, e := range eventsOf(ctx, t, cfg, kvc.Namespace, kvc.Name) {
			if e.Reason != "MemberDefragmented" || !strings.Contains(e.Message, why) {
				continue
			}
			m := defragmentedMessage.FindStringSubmatch(e.Message)
			if m == nil {
				t.Fatalf("a MemberDefragmented event of an unknown form: %q", e.Message)
			}
			took, err := time.ParseDuration(m[3])
			if err != nil || e.Series != nil {
				t.Fatalf("event %q (series %+v): %v", e.Message, e.Series, err)
			}
			out = append(out, defragmentation{Member: m[1], Leader: m[2] != "", From: e.EventTime.Add(-took), To: e.EventTime.Time})
		}
		return len(out) >= len(kvc.Status.Members), nil
	}, wait.WithTimeout(30*time.Second), wait.WithInterval(time.Second))
	return out
}

// raftTerm is the cluster's raft term as a member reports it: it changes with every election.
func raftTerm(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster) uint64 {
	t.Helper()
	var status []struct {
		Status struct {
			RaftTerm uint64 `json:"raftTerm"`
		}
	}
	out := etcdctl(ctx, t, cfg, kvc, kvc.Name+"-0", "endpoint", "status", "-w", "json")
	if err := json.Unmarshal([]byte(out), &status); err != nil || len(status) != 1 || status[0].Status.RaftTerm == 0 {
		t.Fatalf("etcdctl endpoint status: %v: %s", err, out)
	}
	return status[0].Status.RaftTerm
}

// checkLeaderLast: the operator defragmented every member of the cluster once, the leader last
// (the event of its defragmentation says "(the leader)"). Leadership may move on a loaded machine
// (the raft term changed since termBefore): then the member leading when its turn came goes last,
// or none led when its turn came.
func checkLeaderLast(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster, done []defragmentation, termBefore uint64) {
	t.Helper()
	var order, want []string
	for i, d := range done {
		order = append(order, d.Member)
		if d.Leader && i != len(done)-1 {
			t.Errorf("defragmented %s, the leader, before others: %+v", d.Member, done)
		}
	}
	for _, m := range kvc.Status.Members {
		want = append(want, m.Name)
	}
	if slices.Sort(order); !slices.Equal(order, want) {
		t.Errorf("defragmented %+v; want each member of %v once", done, want)
	}
	if len(done) == 0 || done[len(done)-1].Leader {
		return
	}
	if term := raftTerm(ctx, t, cfg, kvc); term == termBefore {
		t.Errorf("no member was defragmented as the leader, and no election took place (raft term %d): %+v", term, done)
	} else {
		t.Logf("no member was the leader when its turn came: leadership moved meanwhile (raft term %d, then %d)", termBefore, term)
	}
}

// checkNoWriteFailedDefragmenting: no write of the writer's that failed since since was in flight
// while a member was defragmented, or in the 3 s after: raft's election timeout, 1 s randomised
// up to 2 s, and the new leader's first commit, should a defragmentation stall the leader. Writes
// fail at other times too on a loaded machine (a leader election): those are logged. failed is
// how many failed since since: all of them must be in the writer's list.
func checkNoWriteFailedDefragmenting(t *testing.T, rep writerReport, failed int, done []defragmentation, since time.Time) {
	t.Helper()
	listed := 0
	for _, f := range rep.Failures {
		if f.Failed.Before(since) {
			continue
		}
		listed++
		i := slices.IndexFunc(done, func(d defragmentation) bool {
			return !f.Sent.After(d.To.Add(3*time.Second)) && !f.Failed.Before(d.From)
		})
		if i < 0 {
			t.Logf("a write failed while no member was defragmented: sent %s, failed %s: %s", f.Sent.Format(time.StampMilli), f.Failed.Format(time.StampMilli), f.Error)
			continue
		}
		t.Errorf("a write failed while %s was defragmented (%s to %s): sent %s, failed %s: %s", done[i].Member, done[i].From.Format(time.StampMilli),
			done[i].To.Format(time.StampMilli), f.Sent.Format(time.StampMilli), f.Failed.Format(time.StampMilli), f.Error)
	}
	if listed < failed {
		t.Errorf("%d writes failed, the writer lists %d of them: the others cannot be told from failures during a defragmentation", failed, listed)
	}
}

// readyUnderWriter creates the cluster in a new namespace named after prefix, waits for it to be
// Ready and starts the writer on it.
func readyUnderWriter(ctx context.Context, t *testing.T, cfg *envconf.Config, prefix string, kvc *kvv1.KVCluster) {
	t.Helper()
	kvc.Namespace = envconf.RandomName(prefix, 16)
	if err := cfg.Client().Resources().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvc.Namespace}}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Client().Resources().Create(ctx, kvc); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, cfg, kvc, 5*time.Minute)
	startWriter(ctx, t, cfg, kvc)
}

func TestNoSpaceRecoversWithoutAPerson(t *testing.T) {
	var kvc *kvv1.KVCluster
	f := features.New("a cluster that filled its quota frees the space and takes writes again by itself").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			// The smallest volume, a quota filled in seconds, and history kept for a minute.
			quota := resource.MustParse("24Mi")
			kvc = &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "full"},
				Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3, Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")},
					Space: kvv1.SpaceSpec{BackendQuota: &quota, AutoCompaction: kvv1.AutoCompactionSpec{Mode: kvv1.AutoCompactionPeriodic, Retention: "1m"}}}}
			readyUnderWriter(ctx, t, cfg, "kvc-space", kvc)
			return ctx
		}).
		Assess("overwrites compacted away by etcd: the operator defragments every member under the writer, the leader last, no write failing for it",
			func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				writerAsk(ctx, t, cfg, kvc, "report", "reset", "true") // the longest stall from here on
				start := time.Now()
				before, term := writerAsk(ctx, t, cfg, kvc, "report"), raftTerm(ctx, t, cfg, kvc)
				// 14 MiB in values of 64 KiB, not 512: the fill leaves free pages behind it, more with
				// bigger values and unequally between members (three etcd 3.7.3 members on loopback:
				// 28 puts of 512 KiB left 1.5Mi free in files of 17.6Mi, 224 of 64 KiB 0.8Mi in 15.5Mi).
				// With 512 KiB a loaded run saw the leader's file at 20Mi of the 24Mi quota during the
				// fill, past the space-pressure mark: the operator rightly defragmented it at once,
				// first, and could not again within the hour once the compaction freed the fill.
				const puts = 224
				raw, err := writerGet(ctx, t, cfg, kvc, "fill", "key", "e2e/space/churn", "kib", "64", "puts", strconv.Itoa(puts))
				var fill fillReport
				if err != nil || json.Unmarshal(raw, &fill) != nil || fill.Puts != puts {
					t.Fatalf("14 MiB of overwrites: %v: %s", err, raw)
				}
				filled := time.Now()
				largest := map[string]int64{} // each member's file as the fill left it, in bytes
				for _, m := range get(ctx, t, cfg, kvc).Status.Members {
					var status []struct {
						Status struct {
							DBSize int64 `json:"dbSize"`
						}
					}
					out := etcdctl(ctx, t, cfg, kvc, m.Name, "endpoint", "status", "-w", "json")
					if err := json.Unmarshal([]byte(out), &status); err != nil || len(status) != 1 {
						t.Fatalf("etcdctl endpoint status in %s: %v: %s", m.Name, err, out)
					}
					largest[m.Name] = status[0].Status.DBSize
				}
				// etcd compacts the minute-old revisions every minute (a compaction may free part of
				// the fill, and the next one the rest); the operator looks every minute, and status
				// shows a member's new size from the reconcile after its defragmentation.
				var got *kvv1.KVCluster
				err = wait.For(func(ctx context.Context) (bool, error) {
					got = get(ctx, t, cfg, kvc)
					return !slices.ContainsFunc(got.Status.Members, func(m kvv1.MemberStatus) bool {
						return m.LastDefragmentTime == nil || m.DBSize == nil || m.DBSize.Value() >= 12<<20
					}), nil
				}, wait.WithTimeout(5*time.Minute), wait.WithInterval(time.Second))
				events := timeline(ctx, t, cfg, kvc.Namespace, kvc.Name)
				if err != nil {
					t.Fatalf("not every member defragmented below half the quota: %+v\nevents:\n%s", got.Status.Members, strings.Join(events, "\n"))
				}
				rep := writerAsk(ctx, t, cfg, kvc, "report", "reset", "true")
				t.Logf("every member defragmented %s after the fill; writes failed meanwhile: %d; the longest the writer went without a write: %d ms",
					time.Since(filled).Round(time.Second), rep.Failed-before.Failed, rep.LongestUnavailableMillis)
				for _, e := range events {
					if strings.HasPrefix(e, "MemberDefragmented: ") {
						t.Logf("%s", e)
					}
				}
				done := defragmentations(ctx, t, cfg, got, "in routine operation")
				checkLeaderLast(ctx, t, cfg, got, done, term)
				checkNoWriteFailedDefragmenting(t, rep, rep.Failed-before.Failed, done, start)
				for _, m := range got.Status.Members {
					t.Logf("%s: database file of %d bytes after the fill, %v after defragmenting (%v in use)", m.Name, largest[m.Name], m.DBSize, m.DBSizeInUse)
					if largest[m.Name] < 12<<20 {
						t.Errorf("%s: database file of %d bytes after the fill; want 12Mi or more (half the quota: worth defragmenting)", m.Name, largest[m.Name])
					}
				}
				return ctx
			}).
		Assess("kvcluster.io/defragment-now: every member once more, at once, though just defragmented, no write failing for it",
			func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				asked := time.Now()
				before, term := writerAsk(ctx, t, cfg, kvc, "report"), raftTerm(ctx, t, cfg, kvc)
				token := "e2e-" + asked.UTC().Format("20060102T150405Z")
				if out, err := kubectl(cfg, "-n", kvc.Namespace, "annotate", "kvc", kvc.Name, "--overwrite", kvv1.AnnotationDefragmentNow+"="+token); err != nil {
					t.Fatalf("kubectl annotate: %v\n%s", err, out)
				}
				var got *kvv1.KVCluster
				err := wait.For(func(ctx context.Context) (bool, error) {
					got = get(ctx, t, cfg, kvc)
					r := got.Status.DefragmentRequest
					return r != nil && r.Token == token && (r.State == kvv1.BackupRequestSucceeded || r.State == kvv1.BackupRequestFailed), nil
				}, wait.WithTimeout(2*time.Minute), wait.WithInterval(time.Second))
				if err != nil {
					t.Fatalf("the defragmentation asked for did not finish: %v; status.defragmentRequest %+v\nevents:\n%s", err, got.Status.DefragmentRequest,
						strings.Join(timeline(ctx, t, cfg, kvc.Namespace, kvc.Name), "\n"))
				}
				r := got.Status.DefragmentRequest
				done := defragmentations(ctx, t, cfg, got, "asked for with "+kvv1.AnnotationDefragmentNow+"="+token)
				var names []string
				for _, d := range done {
					names = append(names, d.Member)
				}
				if r.State != kvv1.BackupRequestSucceeded || !slices.Equal(r.Defragmented, names) {
					t.Errorf("status.defragmentRequest %+v; want Succeeded, listing the members of the events %+v", *r, done)
				}
				checkLeaderLast(ctx, t, cfg, got, done, term)
				for _, m := range got.Status.Members {
					if m.LastDefragmentTime == nil || m.LastDefragmentTime.Time.Before(asked.Add(-time.Second)) {
						t.Errorf("%s: lastDefragmentTime %v, want after the request (%s)", m.Name, m.LastDefragmentTime, asked.Format(time.RFC3339))
					}
				}
				rep := writerAsk(ctx, t, cfg, kvc, "report")
				t.Logf("defragmented %v %s after the annotation; writes failed meanwhile: %d", r.Defragmented, time.Since(asked).Round(time.Second), rep.Failed-before.Failed)
				checkNoWriteFailedDefragmenting(t, rep, rep.Failed-before.Failed, done, asked)
				return ctx
			}).
		Assess("overwriting one key until etcd refuses: compacted, defragmented follower by follower and the leader last, disarmed, no write lost",
			func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				if q := get(ctx, t, cfg, kvc).Status.BackendQuota; q == nil || q.String() != "24Mi" {
					t.Errorf("status.backendQuota = %v, want the spec's 24Mi", q)
				}
				earlier, term := len(timeline(ctx, t, cfg, kvc.Namespace, kvc.Name)), raftTerm(ctx, t, cfg, kvc)
				raw, err := writerGet(ctx, t, cfg, kvc, "fill", "key", "e2e/space/blob", "kib", "512")
				if err != nil {
					t.Fatalf("fill: %v: %s", err, raw)
				}
				var fill fillReport
				if err := json.Unmarshal(raw, &fill); err != nil {
					t.Fatal(err)
				}
				filled := time.Now()
				t.Logf("filled with %d puts of 512 KiB; refused: %s", fill.Puts, fill.Refused)
				if !strings.Contains(fill.Refused, "database space exceeded") {
					t.Fatalf("the fill ended without NOSPACE: %+v", fill)
				}
				before := writerAsk(ctx, t, cfg, kvc, "report")

				var sawNoSpace bool
				var seen string
				err = wait.For(func(ctx context.Context) (bool, error) {
					k := get(ctx, t, cfg, kvc)
					c := meta.FindStatusCondition(k.Status.Conditions, kvv1.ConditionSpacePressure)
					if c != nil && c.Reason == "NoSpace" {
						sawNoSpace = true
					}
					// What a user watching status sees on the way, each change once.
					now := ""
					if c != nil {
						now = c.Reason
					}
					for _, m := range k.Status.Members {
						now += fmt.Sprintf(" %s:%v/%v%v", m.Name, m.DBSize, m.DBSizeInUse, m.Alarms)
						if m.Leader {
							now += "(leader)"
						}
					}
					if now != seen {
						t.Logf("%5.1fs %s", time.Since(filled).Seconds(), now)
						seen = now
					}
					return meta.IsStatusConditionTrue(k.Status.Conditions, kvv1.ConditionReady) &&
						meta.IsStatusConditionFalse(k.Status.Conditions, kvv1.ConditionSpacePressure) &&
						writerAsk(ctx, t, cfg, kvc, "report").Acknowledged > before.Acknowledged+10, nil
				}, wait.WithTimeout(3*time.Minute), wait.WithInterval(time.Second))
				got := get(ctx, t, cfg, kvc)
				events := timeline(ctx, t, cfg, kvc.Namespace, kvc.Name)[earlier:]
				if err != nil {
					t.Fatalf("not recovered: %v\nconditions %+v\nevents:\n%s", err, got.Status.Conditions, strings.Join(events, "\n"))
				}
				rep := writerAsk(ctx, t, cfg, kvc, "report")
				t.Logf("writes taken again %s after the fill was refused; the writer went %d ms without a write; NOSPACE seen in status: %v",
					time.Since(filled).Round(time.Second), rep.LongestUnavailableMillis, sawNoSpace)

				var steps []string
				for _, e := range events {
					reason, _, _ := strings.Cut(e, ": ")
					switch reason {
					case "NoSpace", "SpaceExhausted", "SpaceCompacted", "NoSpaceDisarmed", "SpaceRecovered":
						steps = append(steps, reason)
					case "MemberDefragmented":
						steps = append(steps, "a member defragmented")
					case "FreeSpaceFailed":
						t.Errorf("a step failed: %s", e)
					}
				}
				t.Logf("events:\n%s", strings.Join(events, "\n"))
				t.Logf("steps: %s", strings.Join(steps, ", "))
				// Every member past the mark once after the compaction: the followers, then the leader.
				want := []string{"NoSpace", "SpaceCompacted", "a member defragmented", "a member defragmented", "a member defragmented", "NoSpaceDisarmed", "SpaceRecovered"}
				if !slices.Equal(steps, want) {
					t.Errorf("steps %q, want %q", steps, want)
				}
				checkLeaderLast(ctx, t, cfg, got, defragmentations(ctx, t, cfg, got, "under the NOSPACE alarm"), term)
				for _, m := range got.Status.Members {
					if m.DBSize == nil || got.Status.BackendQuota == nil || m.DBSize.Value()*100 >= got.Status.BackendQuota.Value()*80 || len(m.Alarms) != 0 {
						t.Errorf("member %s after recovery: %v of %v, alarms %v", m.Name, m.DBSize, got.Status.BackendQuota, m.Alarms)
					}
				}
				// etcd applies the put that crosses the quota and answers it with NOSPACE (as after a
				// timeout, a client cannot tell it was not written): the key holds the last acknowledged
				// value or that one.
				last, _ := strconv.Atoi(fill.Last)
				value := etcdctl(ctx, t, cfg, kvc, "full-0", "get", "e2e/space/blob", "--print-value-only")
				if !strings.HasPrefix(value, fill.Last) && !strings.HasPrefix(value, fmt.Sprintf("%016d", last+1)) {
					t.Errorf("the last acknowledged value of the key (number %s) was not kept: starts %.16q", fill.Last, value)
				}
				stopWriter(ctx, t, cfg, kvc, "after compaction")
				return ctx
			}).
		Assess("filled with data compaction cannot free: SpaceExhausted says what to do; a larger spec.space.backendQuota rolls the members and lifts the alarm",
			func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				// Fragmentation alone can bring a file to the quota with the data well under it: then
				// the operator frees it and disarms, and the next round adds more distinct keys (under
				// a prefix of each fill's own), until the data itself fills 80% of the quota.
				var puts, rounds, fills int
				var exhausted *metav1.Condition
				filled := time.Now()
				for verdict := ""; verdict != "SpaceExhausted"; {
					if fills++; rounds >= 4 || fills > 6 {
						t.Fatalf("%d distinct keys of 512 KiB in %d rounds (%d fills), and no SpaceExhausted: %+v", puts, rounds, fills-1, exhausted)
					}
					raw, err := writerGet(ctx, t, cfg, kvc, "fill", "key", fmt.Sprintf("e2e/space/keys/f%d", fills), "kib", "512", "distinct", "true")
					var fill fillReport
					if err != nil || json.Unmarshal(raw, &fill) != nil {
						t.Fatalf("fill with distinct keys: %v: %s", err, raw)
					}
					puts += fill.Puts
					if !strings.Contains(fill.Refused, "database space exceeded") { // a timeout, a leader change: go on filling
						t.Logf("a fill ended before NOSPACE after %d puts: %s", fill.Puts, fill.Refused)
						continue
					}
					rounds, filled, verdict = rounds+1, time.Now(), ""
					if err := wait.For(func(ctx context.Context) (bool, error) {
						exhausted = meta.FindStatusCondition(get(ctx, t, cfg, kvc).Status.Conditions, kvv1.ConditionSpacePressure)
						switch {
						case exhausted != nil && exhausted.Reason == "SpaceExhausted":
							verdict = exhausted.Reason
						case exhausted != nil && exhausted.Reason == "NoSpace":
							verdict = "NoSpace seen"
						case verdict == "NoSpace seen" && exhausted != nil: // disarmed: SpaceAvailable, or NearQuota on sizes rounded up
							verdict = "recovered (" + exhausted.Reason + ")"
						}
						return verdict == "SpaceExhausted" || strings.HasPrefix(verdict, "recovered"), nil
					}, wait.WithTimeout(3*time.Minute), wait.WithInterval(time.Second)); err != nil {
						t.Fatalf("round %d: %d distinct keys of 512 KiB fill the quota, and SpacePressure says %+v", rounds, puts, exhausted)
					}
					t.Logf("round %d: %d distinct keys in all; %s", rounds, puts, verdict)
				}
				t.Logf("%d distinct keys; SpaceExhausted after %s: %s", puts, time.Since(filled).Round(time.Second), exhausted.Message)
				if !strings.Contains(exhausted.Message, "raise spec.space.backendQuota") {
					t.Errorf("SpaceExhausted does not say what to do: %s", exhausted.Message)
				}

				quota := resource.MustParse("48Mi")
				editSpec(ctx, t, cfg, kvc, func(k *kvv1.KVCluster) { k.Spec.Space.BackendQuota = &quota })
				start := time.Now()
				if err := wait.For(func(ctx context.Context) (bool, error) {
					k := get(ctx, t, cfg, kvc)
					return k.Status.BackendQuota != nil && k.Status.BackendQuota.String() == "48Mi" && readyWith(k, 3) &&
						meta.IsStatusConditionFalse(k.Status.Conditions, kvv1.ConditionSpacePressure), nil
				}, wait.WithTimeout(6*time.Minute), wait.WithInterval(time.Second)); err != nil {
					k := get(ctx, t, cfg, kvc)
					t.Fatalf("the raised quota did not lift the alarm: backendQuota %v, conditions %+v\nevents:\n%s", k.Status.BackendQuota,
						k.Status.Conditions, strings.Join(timeline(ctx, t, cfg, kvc.Namespace, kvc.Name), "\n"))
				}
				t.Logf("the members rolled onto the 48Mi quota and the alarm was disarmed %s after the change", time.Since(start).Round(time.Second))
				etcdctl(ctx, t, cfg, kvc, "full-0", "put", "e2e/space/after", "written once the quota was raised")
				// The acknowledged keys, and maybe the one refused at the quota in each round (see above).
				keys := strings.Fields(etcdctl(ctx, t, cfg, kvc, "full-1", "get", "e2e/space/keys/", "--prefix", "--keys-only"))
				if len(keys) < puts || len(keys) > puts+fills {
					t.Errorf("%d keys under e2e/space/keys/, want the %d acknowledged (and at most one more per fill)", len(keys), puts)
				}
				return ctx
			}).
		Teardown(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			_ = cfg.Client().Resources().Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvc.Namespace}})
			return ctx
		}).Feature()
	testAlongsideOthers(t, f)
}

// claimCapacities are the sizes each member's claim has, by name.
func claimCapacities(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster) map[string]string {
	t.Helper()
	var claims corev1.PersistentVolumeClaimList
	if err := cfg.Client().Resources(kvc.Namespace).List(ctx, &claims, func(o *metav1.ListOptions) {
		o.LabelSelector = "app.kubernetes.io/instance=" + kvc.Name
	}); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range claims.Items {
		has := c.Status.Capacity[corev1.ResourceStorage]
		out[c.Name] = has.String()
	}
	return out
}

func TestGrowingVolumesUnderWrites(t *testing.T) {
	var kvc *kvv1.KVCluster
	f := features.New("a larger storage.size grows every member's volume, then the quota follows, under continuous writes").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			kvc = &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "grow"},
				Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3, Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")}}}
			readyUnderWriter(ctx, t, cfg, "kvc-grow", kvc)
			return ctx
		}).
		Assess("512Mi → 768Mi: the claims are expanded (the template keeps 512Mi), then the members restart one at a time onto the default quota of a 768Mi volume",
			func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				before := get(ctx, t, cfg, kvc)
				if v, q := before.Status.VolumeSize, before.Status.BackendQuota; v == nil || v.String() != "512Mi" || q == nil || q.String() != "95Mi" {
					t.Errorf("before: status.volumeSize %v, backendQuota %v; want 512Mi and 95Mi (half of what it holds beside the WAL, rounded down)", v, q)
				}
				uids := map[string]types.UID{}
				for name, p := range memberPods(ctx, t, cfg, kvc) {
					uids[name] = p.UID
				}
				writerAsk(ctx, t, cfg, kvc, "report", "reset", "true")
				editSpec(ctx, t, cfg, kvc, func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("768Mi") })
				start := time.Now()
				var expanded, replaced []string
				var expandedAfter time.Duration
				maxDown, phases := 0, []kvv1.Phase{}
				err := wait.For(func(ctx context.Context) (bool, error) {
					down := 0
					pods := memberPods(ctx, t, cfg, kvc)
					for name, uid := range uids {
						p, ok := pods[name]
						if !ok || p.DeletionTimestamp != nil || !isPodReady(p) {
							down++
						}
						if ok && p.UID != uid && !slices.Contains(replaced, name) {
							replaced = append(replaced, name)
						}
					}
					maxDown = max(maxDown, down)
					for claim, has := range claimCapacities(ctx, t, cfg, kvc) {
						if has == "768Mi" && !slices.Contains(expanded, claim) {
							if expanded = append(expanded, claim); len(expanded) == 3 {
								expandedAfter = time.Since(start)
							}
						}
					}
					k := get(ctx, t, cfg, kvc)
					if len(phases) == 0 || phases[len(phases)-1] != k.Status.Phase {
						phases = append(phases, k.Status.Phase)
					}
					return readyWith(k, 3) && k.Status.BackendQuota != nil && k.Status.BackendQuota.String() == "204Mi" && len(replaced) == 3, nil
				}, wait.WithTimeout(6*time.Minute), wait.WithInterval(300*time.Millisecond))
				after := get(ctx, t, cfg, kvc)
				events := timeline(ctx, t, cfg, kvc.Namespace, kvc.Name)
				if err != nil {
					t.Fatalf("the volumes and the quota did not grow: %v; claims %v, pods replaced %v, status %+v\nevents:\n%s",
						err, claimCapacities(ctx, t, cfg, kvc), replaced, after.Status, strings.Join(events, "\n"))
				}
				rep := writerAsk(ctx, t, cfg, kvc, "report")
				t.Logf("every claim had 768Mi %s after the change; members on the 204Mi quota %s after it, replaced in order %v; phases %v; "+
					"at most %d member(s) down; writer: %d acknowledged, %d failed, longest unavailability %d ms (%s)",
					expandedAfter.Round(time.Second), time.Since(start).Round(time.Second), replaced, phases, maxDown,
					rep.Acknowledged, rep.Failed, rep.LongestUnavailableMillis, rep.LastError)
				if v := after.Status.VolumeSize; v == nil || v.String() != "768Mi" {
					t.Errorf("status.volumeSize = %v, want 768Mi", v)
				}
				if maxDown > 1 {
					t.Errorf("%d members were down at once", maxDown)
				}
				// Expanding and restarting are one change: no Ready between.
				if i := slices.Index(phases, kvv1.PhaseUpgrading); i < 0 || !slices.Equal(phases[i:], []kvv1.Phase{kvv1.PhaseUpgrading, kvv1.PhaseReady}) {
					t.Errorf("phases seen %v, want Upgrading once, then Ready", phases)
				}
				var sts appsv1.StatefulSet
				if err := cfg.Client().Resources().Get(ctx, kvc.Name, kvc.Namespace, &sts); err != nil {
					t.Fatal(err)
				}
				if template := sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]; template.String() != "512Mi" {
					t.Errorf("the claim template asks for %s; a StatefulSet's claim templates cannot change", template.String())
				}
				var requested, grown int
				for _, e := range events {
					requested += strings.Count(e, "VolumeExpansionRequested: asked for 768Mi")
					if strings.HasPrefix(e, "VolumesExpanded: every member's volume has 768Mi now (was 512Mi): the backend quota goes from 95Mi to 204Mi") {
						grown++
					}
				}
				if requested != 3 || grown != 1 {
					t.Errorf("want 3 VolumeExpansionRequested events and 1 VolumesExpanded, got:\n%s", strings.Join(events, "\n"))
				}
				return ctx
			}).
		Assess("a member added afterwards starts on a claim of the template's 512Mi, which is expanded to 768Mi; the others keep their quota",
			func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				editSpec(ctx, t, cfg, kvc, func(k *kvv1.KVCluster) { k.Spec.Partitions = 4 })
				start := time.Now()
				if err := wait.For(func(ctx context.Context) (bool, error) {
					k := get(ctx, t, cfg, kvc)
					return readyWith(k, 4) && claimCapacities(ctx, t, cfg, kvc)["data-grow-3"] == "768Mi", nil
				}, wait.WithTimeout(4*time.Minute), wait.WithInterval(time.Second)); err != nil {
					t.Fatalf("not Ready with 4 members on 768Mi claims: claims %v, status %+v", claimCapacities(ctx, t, cfg, kvc), get(ctx, t, cfg, kvc).Status)
				}
				t.Logf("grow-3 joined and its claim has 768Mi %s after the change", time.Since(start).Round(time.Second))
				expanded := slices.ContainsFunc(timeline(ctx, t, cfg, kvc.Namespace, kvc.Name), func(e string) bool {
					return strings.HasPrefix(e, "VolumeExpansionRequested: asked for 768Mi in volume claim data-grow-3 (was 512Mi)")
				})
				if k := get(ctx, t, cfg, kvc); !expanded || k.Status.BackendQuota == nil || k.Status.BackendQuota.String() != "204Mi" {
					t.Errorf("the added member's claim expanded: %t; backendQuota %v, want it kept at 204Mi", expanded, k.Status.BackendQuota)
				}
				return ctx
			}).
		Assess("every acknowledged write is still there", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			stopWriter(ctx, t, cfg, kvc, "after the volumes grew")
			return ctx
		}).
		Teardown(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			_ = cfg.Client().Resources().Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvc.Namespace}})
			return ctx
		}).Feature()
	testAlongsideOthers(t, f)
}
