package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvcluster/kvcluster-operator/backup"
)

// runBackup is the `backup` subcommand, run by backup Jobs: it streams a snapshot of the cluster
// to the object store and reports the result as the container's termination message, which the
// operator reads. Credentials come only from the environment (the Job maps them from the Secret).
func runBackup(args []string) int {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "", "comma-separated client URLs of the etcd members")
	dst := backup.S3{}
	fs.StringVar(&dst.Endpoint, "s3-endpoint", "", "S3 endpoint host[:port]")
	fs.StringVar(&dst.Bucket, "bucket", "", "bucket")
	fs.StringVar(&dst.Key, "key", "", "object key of the snapshot")
	fs.StringVar(&dst.Region, "region", "us-east-1", "region")
	fs.BoolVar(&dst.Insecure, "insecure", false, "plain HTTP (for a store inside the cluster)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	terminationLog := fs.String("termination-log", "/dev/termination-log", "where the result is written for the operator")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	dst.AccessKey, dst.SecretKey = os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	var missing []string
	for name, v := range map[string]string{"--endpoints": *endpoints, "--s3-endpoint": dst.Endpoint, "--bucket": dst.Bucket,
		"--key": dst.Key, "AWS_ACCESS_KEY_ID": dst.AccessKey, "AWS_SECRET_ACCESS_KEY": dst.SecretKey} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fail(*terminationLog, fmt.Errorf("backup needs %s", strings.Join(missing, ", ")))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	res, err := backup.Take(ctx, strings.Split(*endpoints, ","), dst, time.Now)
	if err != nil {
		return fail(*terminationLog, err)
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if err := os.WriteFile(*terminationLog, out, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "write the termination log:", err)
	}
	return 0
}

func fail(terminationLog string, err error) int {
	msg := "backup failed: " + err.Error()
	fmt.Fprintln(os.Stderr, msg)
	_ = os.WriteFile(terminationLog, []byte(msg), 0o644)
	return 1
}
