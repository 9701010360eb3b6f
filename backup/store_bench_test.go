package backup

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// zeroes is an endless stream, standing in for a snapshot of any size.
type zeroes struct{}

func (zeroes) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// BenchmarkStorePut streams snapshots of two sizes into each store and reports the peak live heap
// during the stream (peak-heap-MiB): it must not grow with the size, since a backup holds one part
// in memory at most. (B/op does grow: it counts short-lived garbage, about 1 MB per S3 part.)
//
//	make bench
func BenchmarkStorePut(b *testing.B) {
	s3 := startS3(b)
	targets := map[string]Store{"s3": s3.store(b), "pvc": NewDirStore(b.TempDir(), "bench")}
	for _, name := range []string{"pvc", "s3"} {
		for _, mib := range []int64{32, 256} {
			b.Run(fmt.Sprintf("%s/%dMiB", name, mib), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(mib << 20)
				peak := watchPeakHeap()
				for i := 0; b.Loop(); i++ {
					key := fmt.Sprintf("bench/%s-%d-%d.db", name, mib, i)
					if _, _, err := targets[name].Put(context.Background(), key, io.LimitReader(zeroes{}, mib<<20)); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					_ = targets[name].Remove(context.Background(), key)
					b.StartTimer()
				}
				b.ReportMetric(float64(peak())/(1<<20), "peak-heap-MiB")
			})
		}
	}
}

// watchPeakHeap samples the live heap every few milliseconds until the returned function is
// called, which returns the highest value seen.
func watchPeakHeap() func() uint64 {
	runtime.GC()
	var peak atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		return peak.Load()
	}
}
