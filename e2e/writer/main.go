// Command writer is the e2e suite's client: it runs in a pod next to a KVCluster and writes one
// key after another through the cluster's client Service while the operator upgrades, scales or
// heals the cluster. It serves what it saw on :8080 (read through the API server's pod proxy):
//
//	/report  writes acknowledged and failed so far, the outages they failed in, and the longest time
//	         without a successful write;
//	         ?reset=true then starts that longest time afresh (to measure one step on its own)
//	/halt    stops writing (e.g. before another cluster takes the Service's name) and reports
//	/stop    stops writing, then checks that every acknowledged key is present and says which are not;
//	         ?endpoints=... checks in another cluster (one restored from a backup of this one)
//	/servercert?addr=host:port  the serial and expiry of the certificate a member serves to a new
//	         connection now (a cluster with TLS: --tls-dir holds its client certificate); when
//	         there is none, why: "connect: ..." or "handshake: ..."
//	/switch?endpoints=...  goes on writing through other endpoints (https ones with the client
//	         certificate in --tls-dir, read now), as an application moving to TLS does
//	/latency?n=2000  stops writing, then times n sequential 256-byte puts and reports percentiles
//	/fill?key=...&kib=512  overwrites one key with kib-KiB values until etcd refuses a put (at its
//	         quota: NOSPACE), filling the database with old revisions, and says how far it got;
//	         &distinct=true writes key/000000, key/000001, ... instead: data that compaction cannot free;
//	         &puts=N stops after N puts
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvcluster/kvcluster-operator/controllers/certs"
)

// Report is what /report and /stop answer.
type Report struct {
	Acknowledged int `json:"acknowledged"`
	Failed       int `json:"failed"`
	// Outages counts the stretches of failed writes with no success between them: a leader
	// handover is one, however many writes it fails (a loaded machine makes it last longer, and
	// fail more of the writes sent 20 ms apart).
	Outages int `json:"outages"`
	// LongestUnavailableMillis is the longest time between two successful writes (or from the last
	// success to now), i.e. the longest the cluster was unavailable to this client.
	LongestUnavailableMillis int64 `json:"longestUnavailableMillis"`
	// LongestUnavailableSince is when that time began (the success before it), to match an outage
	// with what the operator did then (its events).
	LongestUnavailableSince string   `json:"longestUnavailableSince,omitempty"`
	LastError               string   `json:"lastError,omitempty"`
	Checked                 bool     `json:"checked"`
	Missing                 []string `json:"missing,omitempty"`
	Present                 int      `json:"present"`
	// Failures are the last failed writes (up to maxFailures), oldest first: to tell the ones a
	// step of the operator caused from others (a leader election on a loaded machine).
	Failures []Failure `json:"failures,omitempty"`
}

// Failure is a write that failed: when it was sent, when it failed, and why.
type Failure struct {
	Sent   time.Time `json:"sent"`
	Failed time.Time `json:"failed"`
	Error  string    `json:"error"`
}

// maxFailures bounds the failures a report lists.
const maxFailures = 100

// etcdClient is what the writer needs of a *clientv3.Client (a fake in unit tests).
type etcdClient interface {
	clientv3.KV
	Close() error
}

type writer struct {
	prefix string

	// writing is held by the loop from its check of stopped until its write is counted, so that
	// stop can wait for a write in flight: a report taken after stop is the writer's last word.
	writing sync.Mutex

	mu  sync.Mutex
	cli etcdClient
	record
	stopped bool
}

// record is what the writes came to, which a report tells.
type record struct {
	acked       []string
	failed      int
	outages     int
	failing     bool // the last write failed: the next failure is in the same outage
	lastSuccess time.Time
	longest     time.Duration
	longestFrom time.Time
	lastErr     string
	failures    []Failure
}

// handOver stops w and returns a stopped writer that asks cli and carries w's whole record: the
// check of a cluster restored elsewhere (/stop?endpoints) reports the writes made before.
func (w *writer) handOver(cli etcdClient) *writer {
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	next := &writer{cli: cli, prefix: w.prefix, record: w.record, stopped: true}
	next.acked, next.failures = slices.Clone(w.acked), slices.Clone(w.failures)
	return next
}

func (w *writer) run(ctx context.Context, interval time.Duration) {
	for i := 0; ; i++ {
		w.writing.Lock()
		w.mu.Lock()
		stopped, cli := w.stopped, w.cli
		w.mu.Unlock()
		if stopped || ctx.Err() != nil {
			w.writing.Unlock()
			return
		}
		key := fmt.Sprintf("%s%08d", w.prefix, i)
		sent := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Put(cctx, key, sent.UTC().Format(time.RFC3339Nano))
		cancel()
		now := time.Now()
		w.mu.Lock()
		if err != nil {
			if !w.failing {
				w.outages++
			}
			w.failed, w.failing = w.failed+1, true
			w.lastErr = err.Error()
			w.failures = append(w.failures, Failure{Sent: sent, Failed: now, Error: w.lastErr})
			if len(w.failures) > maxFailures {
				w.failures = slices.Delete(w.failures, 0, len(w.failures)-maxFailures)
			}
		} else {
			w.acked, w.failing = append(w.acked, key), false
			if !w.lastSuccess.IsZero() { // measured from the first success: connecting is not an outage
				if gap := now.Sub(w.lastSuccess); gap > w.longest {
					w.longest, w.longestFrom = gap, w.lastSuccess
				}
			}
			w.lastSuccess = now
		}
		w.mu.Unlock()
		w.writing.Unlock()
		time.Sleep(interval)
	}
}

// stop ends the writing loop and waits for its write in flight (it has its own timeout) to be
// counted as acknowledged or failed.
func (w *writer) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.writing.Lock()
	defer w.writing.Unlock()
}

func (w *writer) report() Report {
	w.mu.Lock()
	defer w.mu.Unlock()
	longest, from := w.longest, w.longestFrom
	if !w.stopped && !w.lastSuccess.IsZero() && time.Since(w.lastSuccess) > longest {
		longest, from = time.Since(w.lastSuccess), w.lastSuccess
	}
	rep := Report{Acknowledged: len(w.acked), Failed: w.failed, Outages: w.outages, LongestUnavailableMillis: longest.Milliseconds(), LastError: w.lastErr,
		Failures: slices.Clone(w.failures)}
	if !from.IsZero() {
		rep.LongestUnavailableSince = from.UTC().Format(time.RFC3339Nano)
	}
	return rep
}

// check reads every key under the prefix (linearizably) and lists the acknowledged ones missing.
func (w *writer) check(ctx context.Context) (Report, error) {
	w.stop()
	w.mu.Lock()
	acked, cli := append([]string(nil), w.acked...), w.cli
	w.mu.Unlock()
	rep := w.report()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, w.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return rep, err
	}
	present := map[string]bool{}
	for _, kv := range resp.Kvs {
		present[string(kv.Key)] = true
	}
	for _, k := range acked {
		if !present[k] {
			rep.Missing = append(rep.Missing, k)
		}
	}
	rep.Checked, rep.Present = true, len(present)
	return rep, nil
}

// Latency is what /latency answers: n sequential puts, percentiles in microseconds.
type Latency struct {
	Puts      int   `json:"puts"`
	P50Micros int64 `json:"p50Micros"`
	P90Micros int64 `json:"p90Micros"`
	P99Micros int64 `json:"p99Micros"`
	MaxMicros int64 `json:"maxMicros"`
}

// latency stops the writing loop, then times n sequential puts of 256 bytes with its client.
func (w *writer) latency(ctx context.Context, n int) (Latency, error) {
	w.stop()
	w.mu.Lock()
	cli := w.cli
	w.mu.Unlock()
	value := strings.Repeat("x", 256)
	took := make([]time.Duration, 0, n)
	for i := range n {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := cli.Put(cctx, fmt.Sprintf("%slatency/%08d", w.prefix, i), value)
		cancel()
		if err != nil {
			return Latency{}, err
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	at := func(q float64) int64 { return took[min(len(took)-1, int(q*float64(len(took))))].Microseconds() }
	return Latency{Puts: n, P50Micros: at(0.50), P90Micros: at(0.90), P99Micros: at(0.99), MaxMicros: took[len(took)-1].Microseconds()}, nil
}

// Fill is what /fill answers: the puts acknowledged, the number the last acknowledged value
// starts with, and why the next one was refused.
type Fill struct {
	Puts    int    `json:"puts"`
	Last    string `json:"last"`
	Refused string `json:"refused"`
}

// maxFillPuts bounds /fill: a cluster that takes this many puts has no quota worth the name.
const maxFillPuts = 2000

// fill overwrites key (or, distinct, writes one key after another under it) with values of kib
// KiB, each starting with its number, until etcd refuses one or puts were taken (the writing loop
// goes on beside it).
func (w *writer) fill(ctx context.Context, key string, kib int, distinct bool, puts int) Fill {
	w.mu.Lock()
	cli := w.cli
	w.mu.Unlock()
	padding := strings.Repeat("x", kib<<10-16)
	var f Fill
	for i := range puts {
		number := fmt.Sprintf("%016d", i)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		k := key
		if distinct {
			k = fmt.Sprintf("%s/%06d", key, i)
		}
		_, err := cli.Put(cctx, k, number+padding)
		cancel()
		if err != nil {
			f.Refused = err.Error()
			return f
		}
		f.Puts, f.Last = f.Puts+1, number
	}
	f.Refused = fmt.Sprintf("none: %d puts of %d KiB all taken", puts, kib)
	return f
}

// clientTLS is the writer's TLS configuration for a cluster with TLS (nil without --tls-dir): it
// reads the cluster's client certificate and CA from dir (the mounted Secret) for every new
// connection, as an application must for the operator's renewals and CA rotations to reach it.
func clientTLS(dir string) (*tls.Config, error) {
	if dir == "" {
		return nil, nil
	}
	load := func() (*tls.Config, error) {
		return certs.LoadClientConfig(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	}
	if _, err := load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			current, err := load()
			if err != nil {
				return nil, err
			}
			return &current.Certificates[0], nil
		},
		// The CA is read afresh too; the chain and the name are checked here instead.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			current, err := load()
			if err != nil {
				return err
			}
			opts := x509.VerifyOptions{Roots: current.RootCAs, DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(opts)
			return err
		},
	}, nil
}

// connect is a client for endpoints: over TLS with the client certificate in tlsDir when they are
// https ones.
func connect(endpoints, tlsDir string) (*clientv3.Client, *tls.Config, error) {
	var config *tls.Config
	if strings.HasPrefix(endpoints, "https://") {
		if tlsDir == "" {
			return nil, nil, fmt.Errorf("https endpoints need --tls-dir")
		}
		var err error
		if config, err = clientTLS(tlsDir); err != nil {
			return nil, nil, err
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(endpoints, ","), TLS: config, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	return cli, config, err
}

func main() {
	endpoints := flag.String("endpoints", "", "comma-separated etcd client URLs")
	prefix := flag.String("prefix", "e2e/writer/", "key prefix")
	interval := flag.Duration("interval", 20*time.Millisecond, "pause between writes")
	tlsDir := flag.String("tls-dir", "", "directory of the cluster's client certificate (tls.crt, tls.key, ca.crt), for https endpoints")
	flag.Parse()
	cli, tlsConfig, err := connect(*endpoints, *tlsDir)
	if err != nil {
		log.Fatal(err)
	}
	w := &writer{cli: cli, prefix: *prefix}
	go w.run(context.Background(), *interval)

	reply := func(rw http.ResponseWriter, rep Report, err error) {
		if err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(rep)
	}
	http.HandleFunc("/report", func(rw http.ResponseWriter, r *http.Request) {
		rep := w.report()
		if r.URL.Query().Get("reset") == "true" {
			w.mu.Lock()
			w.longest, w.longestFrom = 0, time.Time{}
			w.mu.Unlock()
		}
		reply(rw, rep, nil)
	})
	http.HandleFunc("/halt", func(rw http.ResponseWriter, _ *http.Request) {
		w.stop()
		reply(rw, w.report(), nil)
	})
	http.HandleFunc("/stop", func(rw http.ResponseWriter, r *http.Request) {
		checker := w
		if eps := r.URL.Query().Get("endpoints"); eps != "" {
			other, _, err := connect(eps, *tlsDir)
			if err != nil {
				reply(rw, Report{}, err)
				return
			}
			defer func() { _ = other.Close() }()
			checker = w.handOver(other)
		}
		rep, err := checker.check(r.Context())
		reply(rw, rep, err)
	})
	http.HandleFunc("/switch", func(rw http.ResponseWriter, r *http.Request) {
		next, config, err := connect(r.URL.Query().Get("endpoints"), *tlsDir)
		if err != nil {
			reply(rw, Report{}, err)
			return
		}
		w.mu.Lock()
		old := w.cli
		w.cli = next
		if config != nil {
			tlsConfig = config
		}
		w.mu.Unlock()
		// A write in flight on the old client finishes first (it has its own timeout).
		time.AfterFunc(5*time.Second, func() { _ = old.Close() })
		reply(rw, w.report(), nil)
	})
	http.HandleFunc("/latency", func(rw http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 1 {
			http.Error(rw, "n must be a positive number", http.StatusBadRequest)
			return
		}
		lat, err := w.latency(r.Context(), n)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(lat)
	})
	http.HandleFunc("/fill", func(rw http.ResponseWriter, r *http.Request) {
		kib, err := strconv.Atoi(r.URL.Query().Get("kib"))
		key := r.URL.Query().Get("key")
		puts := maxFillPuts
		if p := r.URL.Query().Get("puts"); p != "" && err == nil {
			puts, err = strconv.Atoi(p)
		}
		if err != nil || kib < 1 || kib > 1024 || key == "" || puts < 1 || puts > maxFillPuts {
			http.Error(rw, fmt.Sprintf("key must be set, kib a number of KiB from 1 to 1024, puts (optional) from 1 to %d", maxFillPuts), http.StatusBadRequest)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(w.fill(r.Context(), key, kib, r.URL.Query().Get("distinct") == "true", puts))
	})
	http.HandleFunc("/servercert", func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		tlsConfig := tlsConfig
		w.mu.Unlock()
		if tlsConfig == nil {
			http.Error(rw, "no --tls-dir", http.StatusBadRequest)
			return
		}
		addr := r.URL.Query().Get("addr")
		config := tlsConfig.Clone()
		config.ServerName, _, _ = strings.Cut(addr, ":")
		// Reaching the port and the handshake fail differently, so that a test can tell a member
		// that refuses TLS from one it cannot reach.
		raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			http.Error(rw, "connect: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		conn := tls.Client(raw, config)
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if err := conn.Handshake(); err != nil {
			_ = raw.Close()
			http.Error(rw, "handshake: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer func() { _ = conn.Close() }()
		leaf := conn.ConnectionState().PeerCertificates[0]
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(map[string]string{"serial": leaf.SerialNumber.String(), "notAfter": leaf.NotAfter.UTC().Format(time.RFC3339)})
	})
	log.Fatal(http.ListenAndServe(":8080", nil))
}
