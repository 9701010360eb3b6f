//go:build e2e

// Package e2e holds the end-to-end suite: real clusters, real pods, real etcd. The same suite runs
//   - on kind (`make e2e`: E2E_KIND_CLUSTER names the cluster it creates, loading the operator image),
//   - on the project's local cluster (`make e2e-local`), and
//   - on any cluster given with --kubeconfig, with the operator image already available there.
//
// Its first step deploys the operator in-cluster from deploy/ (the Helm chart on the local cluster)
// and waits for it to be Ready.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/env"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/envfuncs"
	"sigs.k8s.io/e2e-framework/pkg/types"
	"sigs.k8s.io/e2e-framework/support"
	"sigs.k8s.io/e2e-framework/third_party/kind"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

const (
	operatorNamespace  = "kvcluster-system"
	operatorDeployment = "kvcluster-operator"
	defaultImage       = "ghcr.io/kvcluster/kvcluster-operator:dev"
	s3Image            = "kvcluster.io/versitygw:dev"
	writerImage        = "kvcluster.io/writer:dev"
	prometheusImage    = "kvcluster.io/prometheus:dev"
)

var (
	testenv env.Environment
	// localCluster is set on the project's own local cluster, where the isolation test applies.
	localCluster = os.Getenv("E2E_LOCAL_CLUSTER") == "1"
)

func TestMain(m *testing.M) {
	if err := kvv1.AddToScheme(scheme.Scheme); err != nil { // the framework's client uses client-go's scheme
		panic(err)
	}
	cfg, err := envconf.NewFromFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e flags:", err)
		os.Exit(2)
	}
	testenv = env.NewWithConfig(cfg)

	if name := os.Getenv("E2E_KIND_CLUSTER"); name != "" && cfg.KubeconfigFile() == "" {
		image := envOr("OPERATOR_IMAGE", defaultImage)
		// Where kind's images cannot be pulled, `make e2e` builds a node image and packs the etcd
		// images here (KVC_LOCAL_DOCKER=1): E2E_KIND_NODE_IMAGE names the one, E2E_KIND_IMAGE_ARCHIVES
		// the others' tarballs (a PATH-style list).
		var opts []support.ClusterOpts
		if node := os.Getenv("E2E_KIND_NODE_IMAGE"); node != "" {
			opts = append(opts, kind.WithImage(node))
		}
		setup := []env.Func{
			envfuncs.CreateClusterWithConfig(kind.NewProvider(), name, "kind-config.yaml", opts...),
			envfuncs.LoadImageToCluster(name, image),
		}
		// The tests' own images: all unless E2E_KIND_TEST_IMAGES names some (a subset of the tests
		// may need fewer: make e2e-kind-smoke); set empty, none.
		testImages, named := os.LookupEnv("E2E_KIND_TEST_IMAGES")
		if !named {
			testImages = strings.Join([]string{s3Image, writerImage, prometheusImage}, " ")
		}
		for _, testImage := range strings.Fields(testImages) {
			setup = append(setup, envfuncs.LoadImageToCluster(name, testImage))
		}
		for _, archive := range filepath.SplitList(os.Getenv("E2E_KIND_IMAGE_ARCHIVES")) {
			setup = append(setup, envfuncs.LoadImageArchiveToCluster(name, archive))
		}
		testenv.Setup(setup...)
		testenv.Finish(envfuncs.DestroyCluster(name))
	} else if cfg.KubeconfigFile() == "" {
		fmt.Fprintln(os.Stderr, "e2e: give --kubeconfig, or set E2E_KIND_CLUSTER to create a kind cluster (make e2e / make e2e-local do)")
		os.Exit(2)
	}
	testenv.Setup(deployOperator)
	os.Exit(testenv.Run(m))
}

// testAlongsideOthers tests f at the same time as the other tests that call it (up to go test's
// -parallel), once the tests that call testenv.Test have run one by one. Most of a test's time is
// spent waiting (for pods, for the kubelet to sync Secrets, for minute-long schedules), which
// overlaps well even on two cores. Only a test that changes nothing outside the namespaces it
// makes, and asserts nothing about the operator as a whole, may call it: the tests that cordon
// the node (alerts), stop or reconfigure the operator (chaos, the namespaced install) or count
// what the whole operator did (deletion's lost final backups) run alone.
func testAlongsideOthers(t *testing.T, f types.Feature) {
	t.Parallel()
	testenv.Test(t, f)
}

// deployOperator installs the operator (CRD, secure-by-default admission policies, RBAC, manager)
// and waits for the manager to be Available: with the Helm chart when $KVC_HELM names a helm
// binary (make e2e-local and make e2e set it), else from deploy/default with kubectl. The chart's test in
// deploy proves both install the same objects.
func deployOperator(ctx context.Context, cfg *envconf.Config) (context.Context, error) {
	if helm := os.Getenv("KVC_HELM"); helm != "" {
		if err := installChart(cfg, helm); err != nil {
			return ctx, err
		}
	} else if out, err := kubectl(cfg, "apply", "--server-side", "--force-conflicts", "-k", filepath.Join("..", "deploy", "default")); err != nil {
		return ctx, fmt.Errorf("deploy the operator from deploy/default: %v\n%s", err, out)
	}
	dep := &appsv1.Deployment{}
	dep.Name, dep.Namespace = operatorDeployment, operatorNamespace
	err := wait.For(conditions.New(cfg.Client().Resources()).DeploymentConditionMatch(dep, appsv1.DeploymentAvailable, "True"),
		wait.WithTimeout(3*time.Minute), wait.WithInterval(2*time.Second))
	if err != nil {
		logs, _ := kubectl(cfg, "-n", operatorNamespace, "describe", "pods")
		return ctx, fmt.Errorf("the operator did not become Available: %v\n%s", err, logs)
	}
	// The API server applies a new admission policy a few seconds after it is created, and until
	// then refuses KVClusters ("Resource kind ... not found"): wait until they give one TLS and a
	// NetworkPolicy.
	err = wait.For(func(ctx context.Context) (bool, error) {
		probe := exec.CommandContext(ctx, envOr("KUBECTL", "kubectl"), "--kubeconfig", cfg.KubeconfigFile(), "create", "--dry-run=server",
			"-o", "jsonpath={.spec.tls.mode}/{.spec.networkPolicy.mode}", "-f", filepath.Join("..", "deploy", "samples", "kvcluster.yaml"), "-n", "default")
		out, err := probe.Output()
		return err == nil && string(out) == string(kvv1.TLSOperator)+"/"+string(kvv1.NetworkPolicyManaged), nil
	}, wait.WithTimeout(time.Minute), wait.WithInterval(time.Second))
	if err != nil {
		return ctx, fmt.Errorf("the secure-by-default admission policies are not in effect a minute after deploying: %v", err)
	}
	return ctx, nil
}

// installChart installs deploy/helm/kvcluster-operator the way the README says: into a namespace
// made beforehand with the restricted Pod Security level deploy/default gives its own; with the
// values given (helm's --set ...), the others default (not those of an earlier install, which an
// upgrade without values would keep).
func installChart(cfg *envconf.Config, helm string, values ...string) error {
	if out, err := kubectl(cfg, "create", "namespace", operatorNamespace); err != nil && !strings.Contains(out, "AlreadyExists") {
		return fmt.Errorf("create the operator's namespace: %v\n%s", err, out)
	}
	if out, err := kubectl(cfg, "label", "--overwrite", "namespace", operatorNamespace, "pod-security.kubernetes.io/enforce=restricted"); err != nil {
		return fmt.Errorf("label the operator's namespace: %v\n%s", err, out)
	}
	args := append([]string{"upgrade", "--install", "kvcluster-operator", filepath.Join("..", "deploy", "helm", "kvcluster-operator"),
		"--kubeconfig", cfg.KubeconfigFile(), "--namespace", operatorNamespace, "--reset-values"}, values...)
	out, err := exec.Command(helm, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("install the operator with its Helm chart: %v\n%s", err, out)
	}
	return nil
}

func kubectl(cfg *envconf.Config, args ...string) (string, error) {
	cmd := exec.Command(envOr("KUBECTL", "kubectl"), append([]string{"--kubeconfig", cfg.KubeconfigFile()}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

var (
	pluginOnce sync.Once
	pluginDir  string
	pluginErr  error
)

// kubectlKVC runs `kubectl kvc ...` as a user would: the plugin built from cmd/kubectl-kvc, found
// by kubectl on the PATH, with the cluster's kubeconfig in $KUBECONFIG.
func kubectlKVC(t *testing.T, cfg *envconf.Config, args ...string) (string, error) {
	t.Helper()
	pluginOnce.Do(func() {
		if pluginDir, pluginErr = os.MkdirTemp("", "kubectl-kvc"); pluginErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(pluginDir, "kubectl-kvc"), "../cmd/kubectl-kvc").CombinedOutput()
		if err != nil {
			pluginErr = fmt.Errorf("build the kubectl plugin: %v\n%s", err, out)
		}
	})
	if pluginErr != nil {
		t.Fatal(pluginErr)
	}
	cmd := exec.Command(envOr("KUBECTL", "kubectl"), append([]string{"kvc"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cfg.KubeconfigFile(), "PATH="+pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
