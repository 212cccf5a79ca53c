"""``verify``: source against target at the same position, row counts and order-independent checksums per table."""

from mirrorline.verify.run import TableCheck, TargetCheck, VerifyError, VerifyReport, verify

__all__ = ["TableCheck", "TargetCheck", "VerifyError", "VerifyReport", "verify"]
