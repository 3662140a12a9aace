"""sageserve: forecast-aware autoscaling of LLM inference fleets on Kubernetes."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sageserve")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"
