package main

import (
	"context"
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
