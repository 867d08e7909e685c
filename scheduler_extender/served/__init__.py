"""The decision path the extender serves, and the simulator and the replay run: ``grouped``
(``GroupedEngine``: equivalence classes decided once, per-job memos, over ``core.engine.Engine``,
the plain reference it must equal), ``equivalence`` (the classes' keys), ``selection`` (best-only
selection) and ``memo`` (bounded memos keyed by content). Above ``core``, below the HTTP service."""
