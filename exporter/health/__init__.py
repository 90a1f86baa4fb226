"""GPU health: what a GPU's health reads say, the one policy table, and the verdict (all pure).

No I/O and no vendor imports here: backends fill :class:`HealthSignals`, the collector calls
:func:`assess` once per pass per physical GPU, render turns the :class:`Verdict` into
``gpu_health{state}``, ``gpu_health_action{action}``, ``gpu_health_reason{reason}`` and
``gpu_health_transitions_total``.
"""

from exporter.health.checks import DEFAULT_CONFIG, HealthConfig, Reason
from exporter.health.policy import ACTIONS, REASONS, STATES
from exporter.health.signals import (
    Ecc,
    EccBlock,
    Fabric,
    FabricState,
    HealthSignals,
    NvLink,
    Pcie,
    RecoveryAction,
    RetiredPages,
    RowRemap,
    Violations,
    XgmiStatus,
    pcie_generation_from_speed,
)
from exporter.health.verdict import HEALTHY_VERDICT, HealthState, Verdict, assess, inherit, mig_verdicts

__all__ = [
    "ACTIONS", "DEFAULT_CONFIG", "HEALTHY_VERDICT", "REASONS", "STATES", "Ecc", "EccBlock", "Fabric",
    "FabricState", "HealthConfig", "HealthSignals", "HealthState", "NvLink", "Pcie", "Reason",
    "RecoveryAction", "RetiredPages", "RowRemap", "Verdict", "Violations", "XgmiStatus", "assess",
    "inherit", "mig_verdicts", "pcie_generation_from_speed",
]
