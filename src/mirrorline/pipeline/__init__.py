"""The running pipeline (DESIGN §1): units of work read from the change log, compiled once into net row changes,
applied to every target; and ``run``, which captures at the same time.

- :mod:`mirrorline.pipeline.plan`: where the next unit ends and when it closes (pure: sizes, schema-change cuts,
  latency).
- :mod:`mirrorline.pipeline.applier`: :class:`Applier`, a unit's life: formed, compiled once, applied to each target;
  failures kept to the target (or table) they belong to.
- :mod:`mirrorline.pipeline.runner`: :class:`Runner`, ``mirrorline run``: capture beside the applier, targets loaded
  beside, the configuration reloaded.
"""

from mirrorline.pipeline.applier import Applier, UnitReport, catch_up_target, known_bags
from mirrorline.pipeline.runner import Runner, RunResult

__all__ = ["Applier", "RunResult", "Runner", "UnitReport", "catch_up_target", "known_bags"]
