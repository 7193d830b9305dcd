"""The kube tier: a real single-node cluster (``scripts/kube-cluster.sh``), started once per run.

The cluster's binaries take about half an hour to build the first time, so this tier skips
unless they are built (``make test-kube`` builds them, starts the cluster and runs the tier). A
cluster that was not running before the run is stopped after it; either way every pod this run
created is deleted, and a stopped cluster leaves no process behind. The ``kube_cluster`` fixture
is ``tests/conftest.py``'s (the runtime suite's ``kube`` backend uses it too).
"""
