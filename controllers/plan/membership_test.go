package plan

import (
	"testing"
	"time"
)

// TestAwaitedPods: the StatefulSet's awaited-pods annotation names the ordinals below its replicas
// with neither pod nor claim (not even one being deleted), once its controller saw its spec; it
// changes, waking the controller, for other ordinals at once, and for the same every 30 s during
// 10 minutes; it keeps its value otherwise.
func TestAwaitedPods(t *testing.T) {
	three := int32(3)
	stamp := func(d time.Duration) string { return t0.Add(d).UTC().Format(time.RFC3339) }
	value := func(ords string, first, last time.Duration) string {
		return ords + "@" + stamp(first) + "@" + stamp(last)
	}
	base := func(mutate func(o *Observation)) Observation {
		o := Observation{STSReplicas: &three, STSSettled: true,
			Pods:   map[int]Pod{0: {}, 1: {}, 2: {}},
			Claims: map[int]Claim{0: {}, 1: {}, 2: {}}}
		mutate(&o)
		return o
	}
	lost := func(ords ...int) func(o *Observation) {
		return func(o *Observation) {
			for _, ord := range ords {
				delete(o.Pods, ord)
				delete(o.Claims, ord)
			}
		}
	}
	awaiting := func(value string, ords ...int) func(o *Observation) {
		return func(o *Observation) { lost(ords...)(o); o.STSAwaitedPods = value }
	}
	for _, tc := range []struct {
		name string
		obs  Observation
		want string
	}{
		{"every member has its pod and claim: the value stays", base(func(o *Observation) { o.STSAwaitedPods = value("1", -time.Hour, -time.Hour) }), value("1", -time.Hour, -time.Hour)},
		{"a pod and its claim gone: named", base(lost(1)), value("1", 0, 0)},
		{"its old claim still being deleted: not yet", base(func(o *Observation) { lost(1)(o); o.ClaimsBeingDeleted = []int{1} }), ""},
		{"named 10 s ago: kept", base(awaiting(value("1", -10*time.Second, -10*time.Second), 1)), value("1", -10*time.Second, -10*time.Second)},
		{"named 30 s ago and still awaited: named again", base(awaiting(value("1", -time.Minute, -30*time.Second), 1)), value("1", -time.Minute, 0)},
		{"awaited for 10 minutes: left to the StatefulSet's own retries", base(awaiting(value("1", -10*time.Minute, -time.Minute), 1)), value("1", -10*time.Minute, -time.Minute)},
		{"other ordinals: named at once", base(awaiting(value("1", -time.Second, -time.Second), 1, 2)), value("1,2", 0, 0)},
		{"a value it cannot read: named anew", base(awaiting("1@yesterday@now", 1)), value("1", 0, 0)},
		{"the controller has not seen the spec: the value stays", base(func(o *Observation) { lost(2)(o); o.STSSettled = false }), ""},
		{"no StatefulSet yet", Observation{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := awaitedPods(tc.obs, t0); got != tc.want {
				t.Errorf("awaitedPods = %q, want %q", got, tc.want)
			}
		})
	}
}
