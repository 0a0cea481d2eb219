"""Deliveries the webhook ingress refused, as explain and the console show them: only
those that may concern a wait, and as evidence that says they were never verified."""

from __future__ import annotations

from typing import Any

from matcher.domain.events import RefusedDelivery


def refusals_for_the_wait(refused: list[RefusedDelivery], tenant: str) -> list[RefusedDelivery]:
    """The refusals that claimed the wait's tenant, or no tenant (one claiming another
    tenant is that tenant's business)."""
    return [r for r in refused if r.claimed_tenant in (None, tenant)]


def refusal_evidence(r: RefusedDelivery) -> dict[str, Any]:
    return {
        "refusal_id": r.id,
        "reason": r.reason,
        "detail": r.detail,
        "source": r.producer,
        "id": r.claimed_event_id,
        "tenant": r.claimed_tenant,
        "type": r.claimed_type,
        "received_at": r.received_at,
        "http_status": r.http_status,
        "kind_count": r.kind_count,
        "verified": False,
    }
