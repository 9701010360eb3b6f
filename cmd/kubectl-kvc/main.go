// kubectl-kvc is the kubectl plugin for KVClusters: `kubectl kvc status|backup|backups|client-config
// NAME`. Install it with `go install github.com/kvcluster/kvcluster-operator/cmd/kubectl-kvc@latest`
// (or `make plugin`, into bin/) and put it on the PATH; kubectl finds it by its name.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

const usage = `kubectl kvc: day-2 commands for KVClusters.

Usage:
  kubectl kvc status NAME          members, leader, versions, last backup and conditions in one screen
  kubectl kvc backup NAME          take a backup now (kvcluster.io/backup-now) and follow it to its end
  kubectl kvc backups NAME         the cluster's backups: its backup Jobs and the ones its status records
  kubectl kvc client-config NAME   the endpoint, and how to connect with etcdctl

Flags (anywhere after the command):
  -n, --namespace NS    the KVCluster's namespace (default: the kubeconfig context's)
  --kubeconfig PATH     kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)
  --context NAME        kubeconfig context
  -o, --output FORMAT   text (default) or json
backup only:
  --token VALUE         the request's value (default: the current UTC time); a value already
                        answered is not taken again: its outcome is shown
  --wait=false          ask and return without following the backup
  --timeout DURATION    how long to follow it (default 45m)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the flags every command takes, and the backup command's.
type options struct {
	kubeconfig, context, namespace, output string
	token                                  string
	wait                                   bool
	timeout                                time.Duration
	// poll is how often backup looks at the request while following it.
	poll time.Duration
}

// run parses args (command, NAME and flags in any order, as kubectl takes them), runs the command
// and returns the exit code: 0 done, 1 failed (a backup that failed, a cluster not found), 2 usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	command := args[0]
	o := options{output: "text", wait: true, timeout: 45 * time.Minute, poll: time.Second}
	fs := flag.NewFlagSet("kubectl kvc "+command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "")
	fs.StringVar(&o.context, "context", "", "")
	for _, name := range []string{"namespace", "n"} {
		fs.StringVar(&o.namespace, name, "", "")
	}
	for _, name := range []string{"output", "o"} {
		fs.StringVar(&o.output, name, "text", "")
	}
	fs.StringVar(&o.token, "token", "", "")
	fs.BoolVar(&o.wait, "wait", true, "")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "")
	var names []string
	for rest := args[1:]; ; {
		if err := fs.Parse(rest); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		names, rest = append(names, fs.Arg(0)), fs.Args()[1:]
	}
	if len(names) != 1 {
		fmt.Fprintf(stderr, "kubectl kvc %s: want exactly one KVCluster NAME, got %d\n\n%s", command, len(names), usage)
		return 2
	}
	if o.output != "text" && o.output != "json" {
		fmt.Fprintf(stderr, "kubectl kvc: --output must be text or json, not %q\n", o.output)
		return 2
	}
	commands := map[string]func(context.Context, client.Client, client.ObjectKey, options, io.Writer) error{
		"status": status, "backup": backupNow, "backups": backups, "client-config": clientConfig,
	}
	cmd, ok := commands[command]
	if !ok {
		fmt.Fprintf(stderr, "kubectl kvc: unknown command %q\n\n%s", command, usage)
		return 2
	}
	c, namespace, err := newClient(o)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl kvc: %v\n", err)
		return 1
	}
	if err := cmd(ctx, c, client.ObjectKey{Namespace: namespace, Name: names[0]}, o, stdout); err != nil {
		fmt.Fprintf(stderr, "kubectl kvc %s: %v\n", command, err)
		return 1
	}
	return 0
}

// newClient follows kubectl's conventions: --kubeconfig, else $KUBECONFIG, else ~/.kube/config;
// --context; the namespace from -n, else the context's, else "default".
func newClient(o options) (client.Client, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: o.context}
	overrides.Context.Namespace = o.namespace
	config := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	namespace, _, err := config.Namespace()
	if err != nil {
		return nil, "", err
	}
	rest, err := config.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{kvv1.AddToScheme, corev1.AddToScheme, batchv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, "", err
		}
	}
	c, err := client.New(rest, client.Options{Scheme: scheme})
	return c, namespace, err
}

// getCluster reads the KVCluster, saying plainly when there is none.
func getCluster(ctx context.Context, c client.Client, key client.ObjectKey) (*kvv1.KVCluster, error) {
	var kvc kvv1.KVCluster
	if err := c.Get(ctx, key, &kvc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("no KVCluster %s in namespace %s", key.Name, key.Namespace)
		}
		return nil, err
	}
	return &kvc, nil
}
