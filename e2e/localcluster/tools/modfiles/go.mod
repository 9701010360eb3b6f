// Module tools/modfiles copies files out of Go modules (the CRDs of Argo CD and Flux the GitOps
// examples are checked against). A separate module so the operator's go.mod stays as it is.
module kvcluster.local/tools/modfiles

go 1.26.8
