// The pod sandbox ("pause") process of the cluster that scripts/kube-cluster.sh starts: no
// registry is reachable here, so the node cannot pull registry.k8s.io/pause.
module kernelbridge.local/kube/pause

go 1.26.0
