"""Instance-scheduler priorities (SageServe §6.1, §6.2).

Interactive requests get priority 0 and are available at once. Batch (NIW) requests get
priority 1, or 0 once they are older than the promotion age (10 h in the paper) so that they
meet the 24 h deadline. Priority-1 requests are admitted only when no priority-0 request
waits ahead of them.
"""

from __future__ import annotations

from sageserve.core.types import Tier

PRIORITY_INTERACTIVE = 0
PRIORITY_BATCH = 1


def scheduler_priority(tier: Tier, age_s: float) -> int:
    """Priority of a request of `tier` that has waited `age_s` seconds since arrival."""
    if tier.interactive:
        return PRIORITY_INTERACTIVE
    if tier.promotion_age_s is not None and age_s > tier.promotion_age_s:
        return PRIORITY_INTERACTIVE
    return tier.priority if tier.priority > 0 else PRIORITY_BATCH
