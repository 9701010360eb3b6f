# kvcluster-operator — see README.md. Everything the tests need is built from source and cached
# outside the repository (~/.cache/kvcluster-operator), so the first run takes long, later ones not.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

BUILD_TOOLS := e2e/localcluster/build.sh
CONTROLLER_GEN := go tool controller-gen
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

.PHONY: verify-generated
verify-generated: generate ## fail when generated files are not checked in up to date
	@git diff --exit-code -- apis deploy/crd deploy/rbac deploy/argocd || { echo "generated files are out of date: run 'make generate' and commit" >&2; exit 1; }
	@test -z "$$(git status --porcelain -- apis deploy/crd deploy/rbac)" || { git status --porcelain -- apis deploy/crd deploy/rbac; echo "untracked generated files: run 'make generate' and commit" >&2; exit 1; }

.PHONY: vet
vet: ## gofmt and go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }
	go vet ./...

.PHONY: build
build: ## build the operator binary into bin/
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/kvcluster-operator ./cmd/kvcluster-operator

.PHONY: tools
tools: ## build (or reuse from the cache) every pinned binary the tests need
	$(BUILD_TOOLS) all

.PHONY: tools-test
tools-test: ## build (or reuse) what 'make test' needs
	$(BUILD_TOOLS) envtest

.PHONY: envtest-assets
envtest-assets:
	$(BUILD_TOOLS) envtest

##@ Tests

.PHONY: test
test: verify-generated vet test-unit ## the whole suite: generated code, unit tests and envtest

.PHONY: test-unit
test-unit: envtest-assets ## unit tests and envtest (a real kube-apiserver and etcd, no kubelet)
	KUBEBUILDER_ASSETS="$$($(BUILD_TOOLS) --print-dir envtest)" go test $(GO_TEST_FLAGS) ./...
