package plan

import (
	"testing"
	"time"
)

// TestAwaitedPods: the StatefulSet's awaited-pods annotation names the ordinals below its replicas
// with neither pod nor claim (not even one being deleted), once its controller saw its spec; it
// changes, waking the controller, for other ordinals or every 30 s for the same, and keeps its
// value otherwise.
func TestAwaitedPods(t *testing.T) {
	three := int32(3)
	stamp := func(at time.Time) string { return at.UTC().Format(time.RFC3339) }
	base := func(mutate func(o *Observation)) Observation {
		o := Observation{STSReplicas: &three, STSSettled: true,
			Pods:   map[int]Pod{0: {}, 1: {}, 2: {}},
			Claims: map[int]Claim{0: {}, 1: {}, 2: {}}}
		mutate(&o)
		return o
	}
	lost := func(ord int) func(o *Observation) {
		return func(o *Observation) { delete(o.Pods, ord); delete(o.Claims, ord) }
	}
	for _, tc := range []struct {
		name string
		obs  Observation
		want string
	}{
		{"every member has its pod and claim: the value stays", base(func(o *Observation) { o.STSAwaitedPods = "1@" + stamp(t0.Add(-time.Hour)) }), "1@" + stamp(t0.Add(-time.Hour))},
		{"a pod and its claim gone: named", base(func(o *Observation) { lost(1)(o) }), "1@" + stamp(t0)},
		{"its old claim still being deleted: not yet", base(func(o *Observation) { lost(1)(o); o.ClaimsBeingDeleted = []int{1} }), ""},
		{"named 10 s ago: kept", base(func(o *Observation) { lost(1)(o); o.STSAwaitedPods = "1@" + stamp(t0.Add(-10*time.Second)) }), "1@" + stamp(t0.Add(-10*time.Second))},
		{"named 30 s ago and still awaited: named again", base(func(o *Observation) { lost(1)(o); o.STSAwaitedPods = "1@" + stamp(t0.Add(-30*time.Second)) }), "1@" + stamp(t0)},
		{"other ordinals: named at once", base(func(o *Observation) { lost(1)(o); lost(2)(o); o.STSAwaitedPods = "1@" + stamp(t0.Add(-time.Second)) }), "1,2@" + stamp(t0)},
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
