"""Peer routers: the request path of regions that live in another cluster.

SageServe's global router sends a region's excess to another region within the plan's
spill-over shares (§5 C2, §6.1). When regions are clusters (docs/regions.md), the pods of
another region are not in this cluster, so this router cannot pick one: it forwards the
request to that cluster's own request path (its `sageserve router`, or a gateway in front
of it), which picks the pod. Peers are named by the operator's configuration (`--peer
REGION=URL`), never by a request, and a forwarded request is served where it lands: it is
never forwarded again (no loops between clusters). The caller's own API key goes with it,
so the peer decides the tenant and its tiers as this router would: tenancy holds across
clusters as long as both clusters list the same keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

#: set on a request this router forwards: its receiver serves it locally, never onwards
FORWARDED_HEADER = "x-sageserve-forwarded"
#: request headers a forwarded request keeps: who the caller is, and the tier it narrows to
#: (the tier header's name is `dispatch.tiers.TIER_HEADER`, passed in by the caller)
IDENTITY_HEADERS = ("authorization",)

_REGION = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class PeerConfigError(ValueError):
    """A `--peer` value that cannot be used; the message names it and the fix."""


def parse_peers(values: Iterable[str]) -> dict[str, str]:
    """REGION=URL entries (`--peer`, or comma-separated in `SAGESERVE_ROUTER_PEERS`) as
    region → base URL of the router or gateway serving that region's cluster."""
    out: dict[str, str] = {}
    for raw in values:
        for value in (v.strip() for v in raw.split(",")):
            if not value:
                continue
            region, sep, url = value.partition("=")
            region, url = region.strip(), url.strip().rstrip("/")
            hint = "expected REGION=URL, e.g. eu-west=https://router.eu-west.example.com"
            if not sep or not region or not url:
                raise PeerConfigError(f"--peer {value!r}: {hint}")
            if not _REGION.fullmatch(region):
                raise PeerConfigError(
                    f"--peer {value!r}: region {region!r} is not a DNS label (lower-case "
                    "letters, digits and '-', at most 63)"
                )
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise PeerConfigError(f"--peer {value!r}: {url!r} is not an http(s) URL; {hint}")
            if parts.query or parts.fragment:
                raise PeerConfigError(f"--peer {value!r}: the URL may carry no query or fragment")
            if region in out and out[region] != url:
                raise PeerConfigError(
                    f"--peer {value!r}: region {region!r} already goes to {out[region]!r}; "
                    "one peer per region"
                )
            out[region] = url
    return out
