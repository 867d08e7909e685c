"""The fake probe: replays a NodeGPUInventory file (JSON or YAML) as if the GPUs had been read.

For tests, the demo and the simulator (``gpuplace-agent --probe fake --fake-inventory FILE``): the
file is read again on every probe, so editing it changes what the agent publishes. The probe stamps
``observedAt`` (now, UTC) and, when given, ``nodeName`` (``--node-name`` / ``NODE_NAME``, else the
file's own) and ``migStrategy`` (``--mig-strategy``, else the file's).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Callable


from node_agent.inventory import InventoryError, NodeGPUInventory, decode_inventory_text, parse_inventory


class FakeProbe:
    """Replays ``path``; raises ``InventoryError`` (naming the file and the field) when it is not a
    valid inventory."""

    def __init__(
        self,
        path: str | Path,
        *,
        node_name: str | None = None,
        mig_strategy: str | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    ) -> None:
        self.path = Path(path)
        self.node_name = node_name
        self.mig_strategy = mig_strategy
        self._clock = clock

    def probe(self) -> NodeGPUInventory:
        source = str(self.path)
        try:
            text = self.path.read_text()
        except OSError as e:
            raise InventoryError(f"{source}: cannot read the fake inventory ({e.strerror or e})") from e
        data = decode_inventory_text(text, source=source)
        if self.node_name:
            data["nodeName"] = self.node_name
        elif not data.get("nodeName"):
            raise InventoryError(f"{source}: nodeName: missing (put it in the file or give --node-name / NODE_NAME)")
        if self.mig_strategy:
            data["migStrategy"] = self.mig_strategy
        data["observedAt"] = self._clock().isoformat()
        return parse_inventory(data, source=source)
