"""Client-sent text as it may appear in a log line.

Anything that can reach the extender's port chooses the pod and node names in a request; written
into a log line as they are, a newline in one forges a line of its own, and a 200 KB name fills the
log. Logged names are therefore cut and escaped here.
"""

from __future__ import annotations

from scheduler_extender.core.requirements import cut

MAX_LOGGED_CHARS = 253
"""Characters of one name kept in a log line: a DNS subdomain's length, the longest valid Kubernetes
object name (RFC 1123, as ``k8s.io/apimachinery`` validates it)."""


def for_log(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """``text`` cut after ``limit`` characters (the full length then noted,
    :func:`~scheduler_extender.core.requirements.cut`) with every non-printable character (newline,
    carriage return, escape sequences) written as its Python escape."""
    shown = cut(text, limit)
    return shown if shown.isprintable() else shown.encode("unicode_escape").decode("ascii")
