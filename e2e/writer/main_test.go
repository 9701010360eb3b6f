package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// slowEtcd holds every put until release is closed, then keeps it; a get lists what was kept.
type slowEtcd struct {
	clientv3.KV
	entered chan struct{}
	release chan struct{}
	kept    chan string
}

func (s *slowEtcd) Put(ctx context.Context, key, _ string, _ ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	select {
	case <-s.release:
		s.kept <- key
		return &clientv3.PutResponse{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *slowEtcd) Get(context.Context, string, ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp := &clientv3.GetResponse{}
	for {
		select {
		case k := <-s.kept:
			resp.Kvs = append(resp.Kvs, &mvccpb.KeyValue{Key: []byte(k)})
		default:
			return resp, nil
		}
	}
}

func (s *slowEtcd) Close() error { return nil }

// A chaos pass compares the acknowledged writes of the report taken at /stop with what the
// restored cluster holds later: a write in flight at /stop and acknowledged after it must be in
// that report already.
func TestStopReportCountsTheWriteInFlight(t *testing.T) {
	etcd := &slowEtcd{entered: make(chan struct{}, 1), release: make(chan struct{}), kept: make(chan string, 10)}
	w := &writer{cli: etcd, prefix: "k/"}
	loopDone := make(chan struct{})
	go func() { defer close(loopDone); w.run(context.Background(), time.Millisecond) }()
	<-etcd.entered // the first put is in flight

	reported := make(chan Report, 1)
	go func() {
		rep, err := w.check(context.Background())
		if err != nil {
			t.Error(err)
		}
		reported <- rep
	}()
	time.Sleep(50 * time.Millisecond) // check runs while the put is still held
	close(etcd.release)
	rep := <-reported
	<-loopDone

	if final := w.report(); rep.Acknowledged != final.Acknowledged || final.Acknowledged != 1 {
		t.Errorf("the report at stop says %d acknowledged writes, the writer ends with %d (want 1 in both)", rep.Acknowledged, final.Acknowledged)
	}
	if !rep.Checked || rep.Present != 1 || len(rep.Missing) != 0 {
		t.Errorf("check: %+v, want the one acknowledged write present", rep)
	}
}

// refusingEtcd refuses every put, numbering its refusals.
type refusingEtcd struct {
	clientv3.KV
	refused atomic.Int64
}

func (r *refusingEtcd) Put(context.Context, string, string, ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return nil, fmt.Errorf("etcdserver: leader changed (%d)", r.refused.Add(1))
}

func (*refusingEtcd) Close() error { return nil }

// A test matches each failed write with what the operator did then: the report lists the last
// failures, oldest first, with when each was sent and failed.
func TestReportListsTheLastFailuresWithTheirTimes(t *testing.T) {
	etcd := &refusingEtcd{}
	w := &writer{cli: etcd, prefix: "k/"}
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	loopDone := make(chan struct{})
	go func() { defer close(loopDone); w.run(ctx, 0) }()
	for w.report().Failed < maxFailures+10 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-loopDone

	rep := w.report()
	if len(rep.Failures) != maxFailures || rep.Failed != int(etcd.refused.Load()) {
		t.Fatalf("%d failures listed, %d counted, %d refused; want the last %d listed, all counted", len(rep.Failures), rep.Failed, etcd.refused.Load(), maxFailures)
	}
	for i, f := range rep.Failures {
		want := fmt.Sprintf("etcdserver: leader changed (%d)", rep.Failed-maxFailures+1+i)
		if f.Error != want || f.Sent.Before(start) || f.Failed.Before(f.Sent) || i > 0 && f.Sent.Before(rep.Failures[i-1].Failed) {
			t.Fatalf("failure %d: %+v; want %q, sent after the start, before it failed and after the one before failed", i, f, want)
		}
	}
}

// scriptedEtcd answers the puts as script says, one letter each ('o' kept, 'x' refused), then
// cancels the writer's loop.
type scriptedEtcd struct {
	clientv3.KV
	script string
	n      int
	done   context.CancelFunc
}

func (s *scriptedEtcd) Put(context.Context, string, string, ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	s.n++
	if s.n == len(s.script) {
		s.done()
	}
	if s.script[s.n-1] == 'x' {
		return nil, fmt.Errorf("etcdserver: request timed out")
	}
	return &clientv3.PutResponse{}, nil
}

func (*scriptedEtcd) Close() error { return nil }

// A leader handover fails however many writes it overlaps: a test counts the outages, the
// stretches of failures between successes.
func TestReportCountsOutagesNotFailedWrites(t *testing.T) {
	for _, tc := range []struct {
		script          string
		failed, outages int
	}{
		{"oooo", 0, 0},
		{"xxoo", 2, 1}, // before the first success: one outage too
		{"oxxxxxxo", 6, 1},
		{"oxoxxoxo", 4, 3},
		{"ooxoox", 2, 2}, // still failing at the end
	} {
		ctx, cancel := context.WithCancel(context.Background())
		w := &writer{cli: &scriptedEtcd{script: tc.script, done: cancel}, prefix: "k/"}
		w.run(ctx, 0)
		if rep := w.report(); rep.Failed != tc.failed || rep.Outages != tc.outages || rep.Acknowledged != len(tc.script)-tc.failed {
			t.Errorf("%s: %d acknowledged, %d failed in %d outages; want %d failed in %d outages", tc.script, rep.Acknowledged, rep.Failed, rep.Outages, tc.failed, tc.outages)
		}
	}
}

// holdingEtcd is a cluster that holds keys (restored from a backup, say); it takes no write.
type holdingEtcd struct {
	clientv3.KV
	keys []string
}

func (h *holdingEtcd) Get(context.Context, string, ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp := &clientv3.GetResponse{}
	for _, k := range h.keys {
		resp.Kvs = append(resp.Kvs, &mvccpb.KeyValue{Key: []byte(k)})
	}
	return resp, nil
}

func (*holdingEtcd) Close() error { return nil }

// A chaos pass restores the cluster elsewhere and checks it through /stop?endpoints: that report
// tells the writes made before (acknowledged, failed, their outages and failures), and which of
// the acknowledged ones the restored cluster lacks.
func TestAHandedOverCheckReportsTheWritesBefore(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{cli: &scriptedEtcd{script: "oxxoxo", done: cancel}, prefix: "k/"}
	w.run(ctx, 0)
	// Its record as handed over: stopped, the time since its last success is no outage (a
	// running writer's report would count it while it is the longest).
	w.stop()
	before := w.report()

	restored := &holdingEtcd{keys: []string{"k/00000000", "k/00000005"}}
	rep, err := w.handOver(restored).check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Acknowledged != 3 || rep.Failed != 3 || rep.Outages != 2 || len(rep.Failures) != 3 ||
		rep.LongestUnavailableMillis != before.LongestUnavailableMillis || rep.LongestUnavailableSince != before.LongestUnavailableSince || rep.LastError != before.LastError {
		t.Errorf("handed over: %+v; want the record of before: %+v", rep, before)
	}
	if !rep.Checked || rep.Present != 2 || fmt.Sprint(rep.Missing) != "[k/00000003]" {
		t.Errorf("checked %v, %d present, missing %v; want the restored cluster read: 2 present, k/00000003 missing", rep.Checked, rep.Present, rep.Missing)
	}
}
