"""The simulator's own errors (what a client would raise is raised as the client seam's errors).

::

    KmqError
    └── SimulationError       a simulation set up wrongly (unknown topic, bad argument)
        └── FaultPlanError    a fault Kafka cannot produce (an acknowledged record that was not written)
"""

from __future__ import annotations

from kmq.core.errors import KmqError

__all__ = ["SimulationError", "FaultPlanError"]


class SimulationError(KmqError):
    """The simulation was asked for something it cannot do; the message names the fix."""


class FaultPlanError(SimulationError, ValueError):
    """A fault plan that asks for something Kafka never does (so a test built on it would prove nothing)."""
