"""Every label, annotation and resource name sageserve reads or writes, in one place.

Why one module: the operator writes pod and node labels, the twin and the router read pod
labels, the simulator and the e2e tooling read node labels from the same Node YAML. Keys
defined twice drift apart; here each is defined once and every world imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: The extended resource a GPU node offers and a serving pod requests.
GPU_RESOURCE = "nvidia.com/gpu"

#: `app.kubernetes.io/managed-by` value of every pod set sageserve renders.
MANAGED_BY = "sageserve"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
#: Pod-set labels: which ModelDeployment, region and variant a pod serves.
LABEL_DEPLOYMENT = "sageserve.io/model-deployment"
LABEL_REGION = "sageserve.io/region"
LABEL_VARIANT = "sageserve.io/variant"
#: `app.kubernetes.io/component` of a ModelDeployment's serving pods (a ModelPool's pods say
#: `pooled-inference`): an InferencePool's selector names it, so that a ModelPool of the
#: same name never joins a ModelDeployment's pool.
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT_INFERENCE = "inference"

#: Node annotations written on donation and reclaim (SageServe §2.3: which model a donated
#: node last served decides whether a reclaim is a 1-minute reload or a 10-minute redeploy).
ANNOTATION_LAST_MODEL = "sageserve.io/last-model"
ANNOTATION_DONATED_AT = "sageserve.io/donated-at"
ANNOTATION_RECLAIMED_AT = "sageserve.io/reclaimed-at"
#: Written when a reclaim is given up because its spot pods' eviction was refused (a
#: PodDisruptionBudget): when, and which pod and budget refused it.
ANNOTATION_BLOCKED_AT = "sageserve.io/reclaim-blocked-at"
ANNOTATION_BLOCKED_BY = "sageserve.io/reclaim-blocked-by"

#: The ReplicaSet controller removes the pods with the lowest cost first on scale-in: the
#: operator sets it on the instance the decision step chose to drain.
ANNOTATION_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: Deletion cost of an instance chosen for draining (every other pod has the default, 0).
DRAIN_DELETION_COST = -1000

#: Pod-set annotation a person sets to say who sizes it (docs/reliability.md): `external`
#: hands it over (sageserve never writes its replicas; removing it hands it back at its
#: size then), `resume` takes it back at its current size after a conflict (sageserve
#: removes the annotation once it has).
ANNOTATION_SCALING = "sageserve.io/scaling"
SCALING_EXTERNAL = "external"
SCALING_RESUME = "resume"
#: Pod-set annotation sageserve writes with every replica count it sets or accepts: a
#: `spec.replicas` that differs was written by someone else since.
ANNOTATION_REPLICAS = "sageserve.io/replicas"
#: Pod-set annotation sageserve writes while KEDA's HPA writes the pod set's replicas for it
#: (`actuation: keda`, docs/keda.md): those writes are sanctioned, not a conflict; back in
#: direct mode sageserve takes the pod set back at its size and removes the annotation.
ANNOTATION_ACTUATION = "sageserve.io/actuation"
ACTUATION_KEDA = "keda"

SERVING_POOL = "serving"
SPOT_POOL = "spot"


@dataclass(frozen=True)
class NodeLabels:
    """Node label keys and pool values; the keys are configurable in the Helm chart."""

    region: str = "topology.kubernetes.io/region"
    gpu_type: str = "nvidia.com/gpu.product"
    pool: str = "sageserve.io/pool"
    serving_pool: str = SERVING_POOL
    spot_pool: str = SPOT_POOL

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NodeLabels:
        """Label keys from the environment the Helm chart sets (`os.environ`), else defaults."""
        return cls(
            region=env.get("SAGESERVE_REGION_LABEL", cls.region),
            gpu_type=env.get("SAGESERVE_GPU_LABEL", cls.gpu_type),
            pool=env.get("SAGESERVE_POOL_LABEL", cls.pool),
        )


DEFAULT_NODE_LABELS = NodeLabels()
