"""The score's components, declared once: name, default weight, meaning.

Each ``ScoreComponent`` names a component (its key in the policy's ``scoring`` and in explain's
``components``), its default weight and what it rewards. From these come the policy's
``ScoringWeights`` model (``core.policy``: one field per component, in this order, and so the
chart's ``values.schema.json``), explain's weights (``ScoringWeights.by_component``) and the
reference's table. Each component's function is in ``core.score``, registered under the same
name (``score.component``); ``core.score`` checks at import that every declared component has
one and no other does. Adding a component: docs/design.md, "Adding a score component".
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ScoreComponent:
    """One score component.

    Attributes:
        name: the policy's and explain's key, camelCase (``vramFit``).
        default_weight: its weight when the policy gives none (>= 0; weights are relative).
        summary: what it rewards, one line (the reference's table).
        description: the policy field's description in its JSON Schema; empty: none.
    """

    name: str
    default_weight: float
    summary: str
    description: str = ""

    @property
    def field_name(self) -> str:
        """The ``ScoringWeights`` attribute: ``vramFit`` -> ``vram_fit``."""
        return re.sub(r"(?<!^)([A-Z])", r"_\1", self.name).lower()


FRAG_DEFAULT = 100
"""``fragmentation``'s default weight: against cost's 5, it decides first (``core.score``)."""

COMPONENTS: tuple[ScoreComponent, ...] = (
    ScoreComponent("cost", 5, "cheapest GPUs that fit first: cheapest candidate's price / this one's"),
    ScoreComponent("vramFit", 2, "least VRAM left unused: need / device VRAM (when the need is known)"),
    ScoreComponent("mig", 1.5, "MIG devices for classes with preferMig or prefer: mig; full GPUs for prefer: full-gpu"),
    ScoreComponent("throughput", 1, "training and fine-tuning: memory bandwidth and dense BF16 TFLOPS against the "
                                    "best candidate"),
    ScoreComponent("nvlink", 1, "prefer: nvlink: the chosen GPUs are NVLink-joined"),
    ScoreComponent("ecc", 1, "prefer: ecc: the chosen GPUs have ECC on"),
    ScoreComponent("packing", 2, "fill nodes already partly used; keep a whole 8-GPU node for a job that needs it "
                                 "(left out where fragmentation applies)"),
    ScoreComponent("fragmentation", FRAG_DEFAULT,
                   "keep free GPUs usable by the pods the cluster sees (FGD), host stranding and scarce models",
                   "Keep free GPUs usable by the pods the cluster sees (FGD, Weng et al., ATC'23); applies "
                   "when the extender has learned the workload."),
)
"""Every score component, in the policy's order."""
