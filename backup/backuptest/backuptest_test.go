package backuptest

import "testing"

// A test that asks for a client and a peer port must get two: etcd cannot listen twice on one
// port (a CI run failed so, "bind: address already in use", when the kernel handed out the
// port it had just handed out).
func TestFreePortNeverHandsOutAPortTwice(t *testing.T) {
	seen := map[int]int{}
	for i := range 1000 {
		p := FreePort(t)
		if j, ok := seen[p]; ok {
			t.Fatalf("call %d returned port %d, which call %d returned already", i, p, j)
		}
		seen[p] = i
	}
}
