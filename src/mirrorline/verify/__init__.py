"""``verify``: source against target at the same position, row counts and order-independent checksums per table."""

from mirrorline.verify.report import TableCheck, TargetCheck, VerifyReport
from mirrorline.verify.run import VerifyError, verify

__all__ = ["TableCheck", "TargetCheck", "VerifyError", "VerifyReport", "verify"]
