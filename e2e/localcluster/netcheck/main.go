// Command netcheck runs in a pod of the local test cluster and proves isolation: every -dial
// address must be unreachable and every -resolve name must not resolve, while every -reach address
// (inside the cluster) must connect, which shows the probe itself works. It prints what happened
// to each and exits non-zero on any leak or failure. With -for, the checks are repeated each
// second until all hold, for at most that long: a NetworkPolicy engine admits a new pod only
// once it has seen it, and follows a policy change within seconds.
//
// With -idle it checks nothing and runs until stopped: a pod to run checks in with kubectl exec,
// from an address the policy engine already knows.
//
//	netcheck -reach kubernetes.default.svc.cluster.local:443 -dial 192.0.2.1:80 -resolve example.com
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var dials, names, reach list
	timeout := flag.Duration("timeout", 5*time.Second, "bound of each attempt")
	wait := flag.Duration("for", 0, "repeat the checks each second until all hold, for at most this long")
	settled := flag.Bool("settled", false, "with -for: a -dial address that connects fails at once (only -reach failures are tried again)")
	flag.Var(&dials, "dial", "HOST:PORT that must not be reachable over TCP (repeatable)")
	flag.Var(&names, "resolve", "name that must not resolve (repeatable)")
	flag.Var(&reach, "reach", "HOST:PORT inside the cluster that must be reachable (repeatable)")
	idle := flag.Bool("idle", false, "check nothing; run until stopped")
	flag.Parse()
	if *idle {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		<-ctx.Done()
		return
	}
	var lines []string
	report := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	deadline := time.Now().Add(*wait)
	attempts := 1
	for {
		failed, leaked := check(reach, dials, names, *timeout, report)
		if !failed && !leaked {
			break
		}
		if time.Now().After(deadline) || (leaked && *settled) {
			fmt.Print(strings.Join(lines, ""))
			fmt.Printf("checks did not hold after %d attempts\n", attempts)
			os.Exit(1)
		}
		lines = nil
		attempts++
		time.Sleep(time.Second)
	}
	fmt.Print(strings.Join(lines, ""))
	fmt.Printf("checks held at attempt %d\n", attempts)
}

// check runs every check once, reporting each through report, and says whether a -reach address
// failed and whether a -dial address connected or a -resolve name resolved.
func check(reach, dials, names []string, timeout time.Duration, report func(format string, args ...any)) (failed, leaked bool) {
	for _, addr := range reach {
		conn, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			failed = true
			report("FAIL reach %s: %v\n", addr, err)
			continue
		}
		_ = conn.Close()
		report("reached %s\n", addr)
	}
	for _, addr := range dials {
		start := time.Now()
		conn, err := net.DialTimeout("tcp", addr, timeout)
		if err == nil {
			_ = conn.Close()
			leaked = true
			report("LEAK dial %s: connected\n", addr)
			continue
		}
		report("blocked dial %s after %s: %v\n", addr, time.Since(start).Round(time.Millisecond), err)
	}
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		addrs, err := net.DefaultResolver.LookupHost(ctx, name)
		cancel()
		if err == nil {
			leaked = true
			report("LEAK resolve %s: %v\n", name, addrs)
			continue
		}
		report("blocked resolve %s: %v\n", name, err)
	}
	return failed, leaked
}
