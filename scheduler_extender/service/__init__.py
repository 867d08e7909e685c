"""The HTTP service kube-scheduler calls: the server and its verbs, the wire format, TLS, the
connection limits, `explain`, metrics and log text. Above ``cluster``, ``served`` and ``core``."""
