//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// BenchmarkClientLatency measures what mutual TLS costs an application: sequential 256-byte puts
// from a pod through a 3-member cluster's client Service, plaintext and with TLS (`make
// bench-tls` on the local cluster). It reports percentiles, not ns/op: one iteration is one
// run of -puts puts by the writer pod.
func BenchmarkClientLatency(b *testing.B) {
	cfg := testenv.EnvConf()
	for _, mode := range []kvv1.TLSMode{kvv1.TLSDisabled, kvv1.TLSOperator} {
		b.Run(string(mode), func(b *testing.B) {
			ctx := context.Background()
			kvc := benchCluster(ctx, b, cfg, mode)
			defer func() { // gone before the next mode's cluster starts: 2 cores are shared
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvc.Namespace}}
				_ = cfg.Client().Resources().Delete(ctx, ns)
				_ = wait.For(conditions.New(cfg.Client().Resources()).ResourceDeleted(ns), wait.WithTimeout(3*time.Minute))
			}()
			var p50, p90, p99, maxMicros int64
			b.ResetTimer()
			for range b.N {
				raw, err := writerGet(ctx, b, cfg, kvc, "latency", "n", "2000")
				if err != nil {
					b.Fatalf("latency: %v: %s", err, raw)
				}
				var lat struct{ P50Micros, P90Micros, P99Micros, MaxMicros int64 }
				if err := json.Unmarshal(raw, &lat); err != nil {
					b.Fatal(err)
				}
				p50, p90, p99, maxMicros = p50+lat.P50Micros, p90+lat.P90Micros, p99+lat.P99Micros, max(maxMicros, lat.MaxMicros)
			}
			n := float64(b.N)
			b.ReportMetric(float64(p50)/n, "p50-µs/put")
			b.ReportMetric(float64(p90)/n, "p90-µs/put")
			b.ReportMetric(float64(p99)/n, "p99-µs/put")
			b.ReportMetric(float64(maxMicros), "max-µs/put")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// benchCluster is a Ready 3-member cluster in its own namespace, with the writer pod next to it.
func benchCluster(ctx context.Context, b *testing.B, cfg *envconf.Config, mode kvv1.TLSMode) *kvv1.KVCluster {
	b.Helper()
	ns := envconf.RandomName("kvc-bench", 16)
	if err := cfg.Client().Resources().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: ns}, Spec: kvv1.KVClusterSpec{
		Version: "3.7.3", Partitions: 3, Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")}, TLS: &kvv1.TLSSpec{Mode: mode}}}
	if err := cfg.Client().Resources().Create(ctx, kvc); err != nil {
		b.Fatal(err)
	}
	waitReady(ctx, b, cfg, kvc, 5*time.Minute)
	startWriter(ctx, b, cfg, kvc)
	return kvc
}
