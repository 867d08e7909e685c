"""Speed-ups around the pure decision: bounded memos keyed by content. Above ``core``."""
