"""Performance model: how long a prefill or a decode iteration takes, and how much KV fits.

Numbers come from the YAML tables in `perf/profiles/`, each row traceable to a published
measurement (see `perf/profiles/README.md`).
"""

from sageserve.perf.model import PerfCatalog, VariantPerf, load_catalog

__all__ = ["PerfCatalog", "VariantPerf", "load_catalog"]
