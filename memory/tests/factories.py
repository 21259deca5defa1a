"""Test helpers: memories with hand-made unit vectors, and memory bindings."""

from __future__ import annotations

import math

from agents.models import CapabilityBinding
from memory.models import Memory

DIMENSIONS = 384


def unit_vector(*weights: tuple[int, float], dimensions: int = DIMENSIONS) -> list[float]:
    """A unit vector with ``weights`` ``[(axis, weight)]`` (normalised), zeros elsewhere."""
    v = [0.0] * dimensions
    for axis, weight in weights:
        v[axis] = weight
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


def memory_make(*, tenant, user, agent, text: str, vector: list[float] | None = None,
                model: str = "all-minilm-l6-v2", **fields) -> Memory:
    """A memory row (``vector`` default: axis 0)."""
    vector = vector or unit_vector((0, 1.0))
    return Memory.all_tenants.create(tenant=tenant, user=user, agent=agent, text=text, embedding=vector,
                                     dimensions=len(vector), embedding_model=model, **fields)


def memory_binding(agent, **config) -> CapabilityBinding:
    """Turn memory on for ``agent`` (a ``memory`` binding with ``config``)."""
    return CapabilityBinding.all_tenants.create(tenant_id=agent.tenant_id, agent=agent, kind="memory", config=config)
