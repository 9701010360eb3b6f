# kvcluster-operator — see README.md. Everything the tests need is built from source and cached
# outside the repository (~/.cache/kvcluster-operator), so the first run takes long, later ones not.
# Every pinned version (KUBERNETES_VERSION, ETCD_VERSION, KIND_VERSION, ...): plain NAME=value lines.
include e2e/localcluster/versions.env
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

BUILD_TOOLS := e2e/localcluster/build.sh
CLUSTER := e2e/localcluster/cluster.sh
# The project's own Docker engine, isolated, for building the Dockerfiles where nothing can be pulled.
DOCKER_SH := e2e/localcluster/docker.sh
# A build on that engine, $(call local_docker_build,TAG,ARGS): on the host's network, which the
# build's `go mod download` needs (the engine has no bridge of its own); the first stage (each
# Dockerfile here names it build) is tagged TAG-build as well, so that pruning what superseded
# builds leave (GBs of modules and build cache each) keeps the layers the next build reuses.
local_docker_build = $(DOCKER_SH) docker build --network host --force-rm --target build -t $(1)-build $(2) && \
  $(DOCKER_SH) docker build --network host --force-rm -t $(1) $(2)
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kvcluster-operator
IMAGE ?= ghcr.io/kvcluster/kvcluster-operator:dev
KIND_CLUSTER ?= kvcluster-e2e
# The local cluster's kubeconfig; `make run` and `make e2e-local` use it unless KUBECONFIG is given.
LOCAL_KUBECONFIG := $(or $(KVC_CLUSTER_DIR),/var/lib/kvcluster-local)/kubeconfig
KUBECTL = $$($(BUILD_TOOLS) --print-dir kubectl)/kubectl
# Tests that touch only their own namespaces run 4 at a time (e2e/main_test.go, testAlongsideOthers).
E2E_FLAGS ?= -count=1 -v -timeout=40m -parallel=4
CONTROLLER_GEN := go tool controller-gen
# The Helm chart (deploy/helm); `make generate` copies into it what it ships unchanged.
CHART := deploy/helm/kvcluster-operator
GO_TEST_FLAGS ?= -count=1

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-18s %s\n", $$1, $$2}'

##@ Development

.PHONY: generate
generate: ## regenerate deepcopy, apply configurations, CRD and RBAC from the Go markers
	$(CONTROLLER_GEN) object applyconfiguration crd paths=./apis/... output:crd:artifacts:config=deploy/crd
	$(CONTROLLER_GEN) rbac:roleName=kvcluster-operator paths=./controllers/... output:rbac:artifacts:config=deploy/rbac
	{ echo "# Generated from health.lua by 'make generate'. Merge into your Argo CD's argocd-cm ConfigMap."; \
	  printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: argocd-cm\n  namespace: argocd\ndata:\n'; \
	  echo "  resource.customizations.health.kvcluster.io_KVCluster: |"; sed 's/^/    /' deploy/argocd/health.lua; } > deploy/argocd/argocd-cm.yaml
	@# The chart ships these unchanged: Helm reads only files inside the chart, so it gets copies.
	rm -rf $(CHART)/crds $(CHART)/files && mkdir -p $(CHART)/crds $(CHART)/files/admission
	cp deploy/crd/kvcluster.io_kvclusters.yaml $(CHART)/crds/
	cp deploy/rbac/role.yaml deploy/monitoring/prometheusrule.yaml deploy/monitoring/dashboard.json $(CHART)/files/
	cp $$(ls deploy/admission/*.yaml | grep -v /kustomization.yaml) $(CHART)/files/admission/

.PHONY: verify-generated
verify-generated: generate ## fail when generated files are not checked in up to date
	@git diff --exit-code -- apis deploy/crd deploy/rbac deploy/argocd $(CHART) || { echo "generated files are out of date: run 'make generate' and commit" >&2; exit 1; }
	@test -z "$$(git status --porcelain -- apis deploy/crd deploy/rbac $(CHART) | grep '^??')" || { git status --porcelain -- apis deploy/crd deploy/rbac $(CHART) | grep '^??'; echo "untracked generated files: run 'make generate' and commit" >&2; exit 1; }

.PHONY: vet
vet: ## gofmt and go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }
	go vet ./...
	go vet -tags e2e ./e2e/

.PHONY: build
build: ## build the operator binary into bin/
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/kvcluster-operator ./cmd/kvcluster-operator

.PHONY: plugin
plugin: ## build the kubectl plugin into bin/kubectl-kvc (put it on the PATH: `kubectl kvc status NAME`)
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/kubectl-kvc ./cmd/kubectl-kvc

.PHONY: tools
tools: ## build (or reuse from the cache) every pinned binary the tests need
	$(BUILD_TOOLS) all

.PHONY: tools-test
tools-test: ## build (or reuse) what 'make test' needs
	$(BUILD_TOOLS) envtest kubernetes coredns versitygw prometheus kwok kube-router helm gitops-crds

.PHONY: envtest-assets
envtest-assets:
	$(BUILD_TOOLS) envtest

##@ The local cluster (real pods, no Docker needed; root on Linux)

.PHONY: cluster-up
cluster-up: ## start the local cluster (idempotent); kubeconfig: /var/lib/kvcluster-local/kubeconfig
	$(CLUSTER) up

.PHONY: cluster-down
cluster-down: ## stop the local cluster and remove everything it made (idempotent)
	$(CLUSTER) down

.PHONY: images-local
images-local: build ## pack the operator and etcd images without Docker and import them into the local cluster
	e2e/localcluster/images.sh $(CACHE_DIR)/images $(IMAGE) bin/kvcluster-operator
	$(CLUSTER) import $(CACHE_DIR)/images/*.tar

.PHONY: image-dockerfile-local
image-dockerfile-local: ## build the operator image with the Dockerfile on the project's own Docker engine (base images it cannot pull: stand-ins made here) and import it into the local cluster
	$(DOCKER_SH) with $(MAKE) --no-print-directory operator-image-on-engine
	$(CLUSTER) import $(CACHE_DIR)/dockerfile-images/operator.tar

# image-dockerfile-local's build, run by `docker.sh with` (which starts the engine and stops it).
.PHONY: operator-image-on-engine
operator-image-on-engine:
	@: $${KVC_DOCKER_HELD:?runs inside docker.sh with: make image-dockerfile-local}
	$(DOCKER_SH) stand-ins
	$(DOCKER_SH) check
	status=0; { $(call local_docker_build,$(IMAGE),.) && mkdir -p $(CACHE_DIR)/dockerfile-images && \
	  $(DOCKER_SH) docker save -o $(CACHE_DIR)/dockerfile-images/operator.tar $(IMAGE); } || status=$$?; \
	  $(DOCKER_SH) docker image prune -f >/dev/null || status=$$?; exit $$status

.PHONY: run
run: ## the main job: the operator managing a sample 3-member KVCluster, on the local cluster unless KUBECONFIG is set
	@if [ -z "$${KUBECONFIG:-}" ]; then $(MAKE) --no-print-directory cluster-up images-local; fi
	@export KUBECONFIG=$${KUBECONFIG:-$(LOCAL_KUBECONFIG)}; \
	  $(KUBECTL) apply --server-side --force-conflicts -k deploy/default && \
	  $(KUBECTL) -n kvcluster-system rollout status deploy/kvcluster-operator --timeout=3m && \
	  for i in $$(seq 30); do [ "$$($(KUBECTL) create --dry-run=server -o jsonpath='{.spec.tls.mode}/{.spec.networkPolicy.mode}' -n default \
	    -f deploy/samples/kvcluster.yaml 2>/dev/null)" = Operator/Managed ] && break; sleep 2; done && \
	  $(KUBECTL) apply -n default -f deploy/samples/kvcluster.yaml && \
	  $(KUBECTL) wait -n default --for=condition=Ready kvc/sample --timeout=5m && \
	  $(KUBECTL) get -n default kvc,statefulsets,pods,pvc -o wide && \
	  echo && echo "The operator manages kvc/sample. Try:" && \
	  echo "  export KUBECONFIG=$$KUBECONFIG; alias kubectl=$(KUBECTL)" && \
	  echo "  kubectl exec -n default sample-0 -- etcdctl --endpoints=https://sample-client.default.svc:2379 \\" && \
	  echo "      --cacert=/etc/etcd/tls/peer/ca.crt --cert=/etc/etcd/tls/peer/tls.crt --key=/etc/etcd/tls/peer/tls.key put greeting hello" && \
	  echo "  kubectl get kvc -n default -w" && \
	  echo "Stop the local cluster with: make cluster-down"

##@ Tests

.PHONY: test
test: verify-generated vet test-unit bench-scale-smoke e2e-local ## the whole suite: generated code, unit tests, envtest, the fleet benchmark at N=10, e2e on the local cluster

.PHONY: test-unit
test-unit: envtest-assets ## unit tests, envtest (a real kube-apiserver and etcd, no kubelet), backup against real etcd and S3, alert rules with promtool, the Helm chart
	$(BUILD_TOOLS) versitygw prometheus kubectl helm gitops-crds
	KVC_REQUIRE_TEST_BINARIES=1 KUBEBUILDER_ASSETS="$$($(BUILD_TOOLS) --print-dir envtest)" \
	KVC_ETCD_DIR="$$($(BUILD_TOOLS) --print-dir etcd-$(ETCD_VERSION))" KVC_VERSITYGW="$$($(BUILD_TOOLS) --print-dir versitygw)" \
	KVC_PROMETHEUS="$$($(BUILD_TOOLS) --print-dir prometheus)" KVC_KUBECTL_DIR="$$($(BUILD_TOOLS) --print-dir kubectl)" \
	KVC_HELM_DIR="$$($(BUILD_TOOLS) --print-dir helm)" KVC_GITOPS_CRDS="$$($(BUILD_TOOLS) --print-dir gitops-crds)" \
	  go test $(GO_TEST_FLAGS) ./...
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(TEST_FUZZTIME)

# Go fuzz targets (package:target). Each one's seed corpus (f.Add, and testdata/fuzz/<target>/,
# where a fuzzing run writes any input that fails) runs in every `go test`.
FUZZ_TARGETS = ./apis/v1alpha1:FuzzAdmittedClustersMakeValidObjects ./backup:FuzzSchedule ./backup:FuzzRetention ./deploy/argocd:FuzzHealthScript
FUZZTIME ?= 2m
# make test fuzzes each target for a number of inputs, not a time: with a time, Go 1.26's fuzzing
# coordinator can fail a target that found nothing ("context deadline exceeded" as -fuzztime ends,
# golang/go#75804, fixed in Go 1.27); it did once in CI. 10,000 inputs: 2–47 s per target here.
TEST_FUZZTIME ?= 10000x

.PHONY: fuzz
fuzz: ## fuzz each target for FUZZTIME (default 2m; make test fuzzes 10000 inputs each); a failing input is kept in testdata/fuzz
	@for t in $(FUZZ_TARGETS); do \
	  echo "fuzzing $${t#*:} for $(FUZZTIME)"; \
	  go test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) "$${t%%:*}" || exit 1; \
	done

# The chaos suite's budget: faults injected in all (a pass in progress finishes), and the time after
# which no new pass starts; CHAOS_SEED replays a run's choices.
CHAOS_FAULTS ?= 50
CHAOS_DURATION ?= 35m

.PHONY: chaos
chaos: ## the whole life of a cluster, pass after pass, with the operator, members and API server killed at random moments (CHAOS_FAULTS, CHAOS_DURATION, CHAOS_SEED); ends with a table
	$(MAKE) --no-print-directory cluster-down cluster-up images-local
	status=0; E2E_LOCAL_CLUSTER=1 KUBECTL=$(KUBECTL) CHAOS_FAULTS=$(CHAOS_FAULTS) CHAOS_DURATION=$(CHAOS_DURATION) CHAOS_SEED=$(CHAOS_SEED) \
	  go test -tags e2e -count=1 -v -timeout=75m -run '^TestChaos$$' ./e2e/ -args --kubeconfig=$(LOCAL_KUBECONFIG) || status=$$?; \
	  $(CLUSTER) down; exit $$status

.PHONY: bench
bench: ## memory and speed of streaming backups into each store (B/op must not grow with the size)
	$(BUILD_TOOLS) versitygw etcd-$(ETCD_VERSION)
	KVC_VERSITYGW="$$($(BUILD_TOOLS) --print-dir versitygw)" go test -run '^$$' -bench StorePut -benchtime 3x ./backup/

# The fleet benchmark's sizes; it rewrites e2e/scale/BENCHMARKS.md.
# 1,000 TLS clusters take 9-11 minutes to create on a 2-core machine, the whole run at 1,000
# 35-36 minutes (see README).
BENCH_SCALE_N ?= 10,100
# More flags of the benchmark (go run ./e2e/scale -h), e.g. "-wait-per-cluster=1.5s -upgrade-wait-per-cluster=1s" for 1,000 clusters.
BENCH_SCALE_FLAGS ?=
BENCH_SCALE = $(BUILD_TOOLS) kubernetes etcd-$(ETCD_VERSION) kwok && \
	KVC_KWOK="$$($(BUILD_TOOLS) --print-dir kwok)" KVC_KUBERNETES="$$($(BUILD_TOOLS) --print-dir kubernetes)" \
	KVC_ETCD_DIR="$$($(BUILD_TOOLS) --print-dir etcd-$(ETCD_VERSION))" go run ./e2e/scale

.PHONY: bench-scale
bench-scale: ## the operator with BENCH_SCALE_N clusters on a simulated node (kwok): creation, idle, frozen members, upgrade, deletion; tables into e2e/scale/BENCHMARKS.md
	$(BENCH_SCALE) -n $(BENCH_SCALE_N) $(BENCH_SCALE_FLAGS) -out e2e/scale/BENCHMARKS.md

.PHONY: bench-scale-smoke
bench-scale-smoke: ## the fleet benchmark with 10 clusters, failing on any cluster not Ready, upgraded or deleted, or a write to the idle fleet (by the operator or one restarted against it)
	$(BENCH_SCALE) -n 10 -check

.PHONY: bench-tls
bench-tls: ## request latency through the client Service, plaintext and mutual TLS, on the local cluster (percentiles per put)
	$(MAKE) --no-print-directory cluster-down cluster-up images-local
	status=0; E2E_LOCAL_CLUSTER=1 KUBECTL=$(KUBECTL) go test -tags e2e -run '^$$' -bench ClientLatency -benchtime 3x ./e2e/ \
	  -args --kubeconfig=$(LOCAL_KUBECONFIG) || status=$$?; \
	  $(CLUSTER) down; exit $$status

# etcd-io/etcd-operator's source (a git checkout; measured: main at 77c7f10, v0.2.0-53), for
# bench-peers: its module is not served by the Go module proxy, so it cannot be fetched here.
# Without it, bench-peers measures this operator against the bare StatefulSet only.
ETCD_OPERATOR_SRC ?=
BENCH_PEERS_ROUNDS ?= 5

.PHONY: bench-peers
bench-peers: ## apply → Ready of a 3-member cluster on the local cluster: a bare StatefulSet (the floor), this operator, etcd-io/etcd-operator (ETCD_OPERATOR_SRC); table into e2e/BENCHMARKS-peers.md
	$(MAKE) --no-print-directory cluster-down cluster-up images-local
	status=0; \
	if [ -n "$(ETCD_OPERATOR_SRC)" ]; then \
	  version=$$(e2e/localcluster/etcd-operator.sh "$(ETCD_OPERATOR_SRC)" "$(abspath $(CACHE_DIR))/etcd-operator" $(KUBECTL)) && \
	  $(CLUSTER) import "$(abspath $(CACHE_DIR))/etcd-operator/etcd-operator.tar" && \
	  export ETCD_OPERATOR_MANIFEST="$(abspath $(CACHE_DIR))/etcd-operator/install.yaml" ETCD_OPERATOR_VERSION="$$version" || status=$$?; \
	fi; \
	[ $$status -ne 0 ] || E2E_LOCAL_CLUSTER=1 KUBECTL=$(KUBECTL) BENCH_PEERS_OUT=$(CURDIR)/e2e/BENCHMARKS-peers.md \
	  go test -tags e2e -count=1 -timeout=$$(( ($(BENCH_PEERS_ROUNDS) + 1) * 5 + 10 ))m -run '^$$' -bench ReadyBesidePeers -benchtime $(BENCH_PEERS_ROUNDS)x ./e2e/ \
	  -args --kubeconfig=$(LOCAL_KUBECONFIG) || status=$$?; \
	  $(CLUSTER) down; exit $$status

.PHONY: e2e-local
e2e-local: ## e2e on the project's local cluster: up, import images (packed without Docker), install the operator with the Helm chart, run the suite, down
	$(MAKE) --no-print-directory cluster-down cluster-up images-local
	$(BUILD_TOOLS) helm
	status=0; E2E_LOCAL_CLUSTER=1 KUBECTL=$(KUBECTL) KVC_HELM="$$($(BUILD_TOOLS) --print-dir helm)/helm" \
	  go test -tags e2e $(E2E_FLAGS) ./e2e/ -args --kubeconfig=$(LOCAL_KUBECONFIG) || status=$$?; \
	  if [ $$status -ne 0 ] && [ -n "$${KEEP_CLUSTER:-}" ]; then echo "KEEP_CLUSTER set: the cluster is left running" >&2; exit $$status; fi; \
	  $(CLUSTER) down; exit $$status

.PHONY: e2e-kubeconfig
e2e-kubeconfig: ## e2e on an existing cluster: make e2e-kubeconfig KUBECONFIG=... (the operator image must be available there)
	KUBECTL=$(KUBECTL) go test -tags e2e $(E2E_FLAGS) ./e2e/ -args --kubeconfig=$${KUBECONFIG:?set KUBECONFIG}

# KVC_LOCAL_DOCKER=1: `make e2e` pulls nothing. It runs on the project's own Docker engine
# (e2e/localcluster/docker.sh), on images built here: the Dockerfiles' base images where they
# cannot be pulled (stand-ins), the kind node image (kind-node.sh) and the etcd images (images.sh).
# The tests' own images make e2e builds with their Dockerfiles and loads into kind, beside the
# operator's: the S3 store (backups), the writer (writes under upgrades), Prometheus (alerts).
S3_IMAGE := kvcluster.io/versitygw:dev
WRITER_IMAGE := kvcluster.io/writer:dev
PROMETHEUS_IMAGE := kvcluster.io/prometheus:dev
E2E_KIND_TEST_IMAGES ?= $(S3_IMAGE) $(WRITER_IMAGE) $(PROMETHEUS_IMAGE)
ifneq ($(filter-out $(S3_IMAGE) $(WRITER_IMAGE) $(PROMETHEUS_IMAGE),$(E2E_KIND_TEST_IMAGES)),)
$(error E2E_KIND_TEST_IMAGES names images make e2e does not build: $(filter-out $(S3_IMAGE) $(WRITER_IMAGE) $(PROMETHEUS_IMAGE),$(E2E_KIND_TEST_IMAGES)))
endif
ifneq ($(filter-out 0 1,$(KVC_LOCAL_DOCKER)),)
$(error KVC_LOCAL_DOCKER is 1 (build every image here, pull nothing) or 0/unset (Docker as it is), not '$(KVC_LOCAL_DOCKER)')
endif
ifeq ($(KVC_LOCAL_DOCKER),1)
docker_build = $(call local_docker_build,$(1),$(2))
KIND_LOCAL_ENV = node=$$(e2e/localcluster/kind-node.sh) && export E2E_KIND_NODE_IMAGE=$$node E2E_KIND_ISOLATED=1 \
  E2E_KIND_IMAGE_ARCHIVES=$(CACHE_DIR)/images/etcd-v$(ETCD_VERSION).tar:$(CACHE_DIR)/images/etcd-v$(ETCD_PREVIOUS_VERSION).tar:$(CACHE_DIR)/images/netcheck.tar &&
else
docker_build = docker build -t $(1) $(2)
endif

.PHONY: e2e
e2e: ## e2e on kind (needs Docker): builds the images with their Dockerfiles, creates a kind cluster, loads them, installs the operator with the Helm chart, runs the suite (KVC_LOCAL_DOCKER=1: pulls nothing, see above)
	GOBIN=$(CURDIR)/bin go install sigs.k8s.io/kind@$(KIND_VERSION)
	$(BUILD_TOOLS) helm
ifeq ($(KVC_LOCAL_DOCKER),1)
	$(MAKE) --no-print-directory build
	e2e/localcluster/images.sh $(CACHE_DIR)/images $(IMAGE) bin/kvcluster-operator
	$(DOCKER_SH) with $(MAKE) --no-print-directory e2e-on-docker
else
	$(MAKE) --no-print-directory e2e-on-docker
endif

# make e2e's images and suite on the Docker engine: the machine's, or (KVC_LOCAL_DOCKER=1) the
# project's, held by `docker.sh with`, which stops it however this ends.
.PHONY: e2e-on-docker
e2e-on-docker:
ifeq ($(KVC_LOCAL_DOCKER),1)
	@: $${KVC_DOCKER_HELD:?runs inside docker.sh with: make e2e KVC_LOCAL_DOCKER=1}
	$(DOCKER_SH) stand-ins
	$(DOCKER_SH) check
endif
	$(call docker_build,$(IMAGE),.)
	$(if $(filter $(S3_IMAGE),$(E2E_KIND_TEST_IMAGES)),$(call docker_build,$(S3_IMAGE),--build-arg VERSITYGW_VERSION=$(VERSITYGW_VERSION) -f e2e/s3.Dockerfile e2e))
	$(if $(filter $(WRITER_IMAGE),$(E2E_KIND_TEST_IMAGES)),$(call docker_build,$(WRITER_IMAGE),-f e2e/writer.Dockerfile .))
	$(if $(filter $(PROMETHEUS_IMAGE),$(E2E_KIND_TEST_IMAGES)),$(call docker_build,$(PROMETHEUS_IMAGE),--build-arg PROMETHEUS_VERSION=$(PROMETHEUS_VERSION) -f e2e/prometheus.Dockerfile e2e))
ifeq ($(KVC_LOCAL_DOCKER),1)
	$(DOCKER_SH) docker image prune -f >/dev/null
endif
	$(KIND_LOCAL_ENV) PATH=$(CURDIR)/bin:$$PATH E2E_KIND_CLUSTER=$(KIND_CLUSTER) OPERATOR_IMAGE=$(IMAGE) E2E_KIND_TEST_IMAGES="$(E2E_KIND_TEST_IMAGES)" \
	  KVC_HELM="$$($(BUILD_TOOLS) --print-dir helm)/helm" go test -tags e2e $(E2E_FLAGS) ./e2e/

.PHONY: e2e-kind-smoke
e2e-kind-smoke: ## what CI runs of `make e2e` (KVC_LOCAL_DOCKER=1): the sample's lifecycle, backups to S3 and to a claim (their Jobs, restores' init containers), the namespaced install, and that pods cannot leave the machine
	$(MAKE) --no-print-directory e2e KVC_LOCAL_DOCKER=1 E2E_KIND_TEST_IMAGES=$(S3_IMAGE) \
	  E2E_FLAGS='-count=1 -v -timeout=20m -parallel=4 -run "^(TestOperatorIsDeployed|TestSampleClusterLifecycle|TestBackups|TestANamespacedInstall|TestPodsCannotLeaveTheMachine)"'
