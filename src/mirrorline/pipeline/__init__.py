"""The running pipeline (DESIGN §1): units of work read from the change log, compiled once into net row changes,
applied to every target; and ``run``, which captures at the same time.

- :mod:`mirrorline.pipeline.plan`: where the next unit ends and when it closes (pure: sizes, schema-change cuts,
  latency).
- :mod:`mirrorline.pipeline.units`: forming and compiling units (once for every target at a position; the next one
  compiled while this one applies).
- :mod:`mirrorline.pipeline.applier`: :class:`Applier`, the loop: each step a unit formed, compiled once, applied to
  each target at its position.
- :mod:`mirrorline.pipeline.roster`: each target's phase in the pipeline and the one failure handler (a table stops
  alone, or its target does); :mod:`mirrorline.pipeline.held`: tables stopped alone, catching up;
  :mod:`mirrorline.pipeline.backoff`: the one retry mechanism.
- :mod:`mirrorline.pipeline.runner`: :class:`Runner`, ``mirrorline run``: capture beside the applier, targets loaded
  beside, the configuration reloaded.
"""

from mirrorline.pipeline.applier import Applier, catch_up_target
from mirrorline.pipeline.runner import Runner, RunResult
from mirrorline.pipeline.units import UnitReport, known_bags

__all__ = ["Applier", "RunResult", "Runner", "UnitReport", "catch_up_target", "known_bags"]
