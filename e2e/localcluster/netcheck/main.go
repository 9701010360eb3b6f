// Command netcheck runs in a pod of the local test cluster and proves isolation: every -dial
// address must be unreachable and every -resolve name must not resolve, while every -reach address
// (inside the cluster) must connect, which shows the probe itself works. It prints what happened
// to each and exits non-zero on any leak or failure.
//
//	netcheck -reach kubernetes.default.svc.cluster.local:443 -dial 192.0.2.1:80 -resolve example.com
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var dials, names, reach list
	timeout := flag.Duration("timeout", 5*time.Second, "bound of each attempt")
	flag.Var(&dials, "dial", "HOST:PORT that must not be reachable over TCP (repeatable)")
	flag.Var(&names, "resolve", "name that must not resolve (repeatable)")
	flag.Var(&reach, "reach", "HOST:PORT inside the cluster that must be reachable (repeatable)")
	flag.Parse()
	leaked := false
	for _, addr := range reach {
		conn, err := net.DialTimeout("tcp", addr, *timeout)
		if err != nil {
			leaked = true
			fmt.Printf("FAIL reach %s: %v\n", addr, err)
			continue
		}
		_ = conn.Close()
		fmt.Printf("reached %s\n", addr)
	}
	for _, addr := range dials {
		start := time.Now()
		conn, err := net.DialTimeout("tcp", addr, *timeout)
		if err == nil {
			_ = conn.Close()
			leaked = true
			fmt.Printf("LEAK dial %s: connected\n", addr)
			continue
		}
		fmt.Printf("blocked dial %s after %s: %v\n", addr, time.Since(start).Round(time.Millisecond), err)
	}
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		addrs, err := net.DefaultResolver.LookupHost(ctx, name)
		cancel()
		if err == nil {
			leaked = true
			fmt.Printf("LEAK resolve %s: %v\n", name, addrs)
			continue
		}
		fmt.Printf("blocked resolve %s: %v\n", name, err)
	}
	if leaked {
		os.Exit(1)
	}
}
