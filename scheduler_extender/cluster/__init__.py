"""The cluster side: the watch loop, the node/pod cache, the state sources, the policy ConfigMap,
the requeue of rejected pods and the pending-pods watch. Above ``served`` and ``core``; never
imports ``service`` at run time."""
