"""Pod sets rendered from a ModelDeployment: names, placement, GPUs, server arguments."""

from __future__ import annotations

from pathlib import Path

import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.podset import policy_scheduling, render_pod_set, render_pod_sets
from sageserve.core.labels import NodeLabels

ROOT = Path(__file__).resolve().parents[2]


def _llama() -> ModelDeployment:
    docs = yaml.safe_load_all((ROOT / "policies" / "base" / "models.yaml").read_text())
    return ModelDeployment.model_validate(next(iter(docs)))


def _match(deployment: dict) -> dict[str, list[str]]:
    terms = deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return {e["key"]: e["values"] for e in terms[0]["matchExpressions"]}


def test_one_pod_set_per_region_and_variant_with_deterministic_names() -> None:
    md = _llama()
    sets = render_pod_sets(md, {}, namespace="llm")
    names = [d["metadata"]["name"] for d in sets]
    assert names == [
        f"llama-2-70b-{r}-{v}"
        for r in ("us-east", "us-central", "us-west")
        for v in ("h100", "a100")
    ]
    assert render_pod_sets(md, {}, namespace="llm") == sets  # idempotent


def test_pods_are_pinned_to_region_gpu_type_and_serving_pool() -> None:
    md = _llama()
    d = render_pod_set(md, md.spec.regions[1], md.spec.variants[1], 3, "llm")
    assert _match(d) == {
        "topology.kubernetes.io/region": ["us-central"],
        "nvidia.com/gpu.product": ["NVIDIA-A100-SXM4-80GB"],
        "sageserve.io/pool": ["serving"],
    }
    container = d["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "8"}
    assert d["spec"]["replicas"] == 3


def test_node_label_keys_come_from_configuration() -> None:
    md = _llama()
    labels = NodeLabels(
        region="example.com/dc", gpu_type="example.com/gpu", pool="example.com/pool"
    )
    d = render_pod_set(md, md.spec.regions[0], md.spec.variants[0], 1, "llm", node_labels=labels)
    assert set(_match(d)) == {"example.com/dc", "example.com/gpu", "example.com/pool"}


def test_server_arguments_carry_model_name_and_parallelism() -> None:
    md = _llama()
    md.spec.model.served_name = "llama70"
    md.spec.engine.args = ["--max-model-len", "4096"]
    md.spec.variants[0].pipeline_parallel = 2
    d = render_pod_set(md, md.spec.regions[0], md.spec.variants[0], 1, "llm")
    args = d["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["--model", "meta-llama/Llama-2-70b-hf", "--served-model-name", "llama70"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    assert args[-2:] == ["--max-model-len", "4096"]


def test_owner_reference_makes_the_model_deployment_the_controller() -> None:
    md = _llama()
    d = render_pod_set(md, md.spec.regions[0], md.spec.variants[0], 1, "llm", owner_uid="u-1")
    [owner] = d["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "ModelDeployment",
        "llama-2-70b",
        "u-1",
        True,
    )


def test_pods_are_scraped_by_prometheus_and_selected_by_stable_labels() -> None:
    md = _llama()
    d = render_pod_set(md, md.spec.regions[0], md.spec.variants[0], 1, "llm")
    template = d["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    selector = d["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert selector == {
        "sageserve.io/model-deployment": "llama-2-70b",
        "sageserve.io/region": "us-east",
        "sageserve.io/variant": "h100",
    }


def test_initial_size_goes_to_the_first_variant_until_a_plan_says_otherwise() -> None:
    md = _llama()
    sets = render_pod_sets(md, {("us-west", "a100"): 5}, namespace="llm")
    sizes = {d["metadata"]["name"]: d["spec"]["replicas"] for d in sets}
    assert sizes["llama-2-70b-us-east-h100"] == 20
    assert sizes["llama-2-70b-us-east-a100"] == 0
    assert sizes["llama-2-70b-us-west-a100"] == 5


def _policy(name: str, scheduling: dict | None) -> dict:
    spec = {} if scheduling is None else {"instanceScheduling": scheduling}
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": name, "namespace": "llm"},
        "spec": spec,
    }


def _args(policies: list[dict]) -> list[str]:
    md = _llama()
    scheduling = policy_scheduling(policies, md.spec.policy_ref.name)
    sets = render_pod_sets(md, {}, namespace="llm", scheduling=scheduling)
    return list(sets[0]["spec"]["template"]["spec"]["containers"][0]["args"])


def test_a_policy_ordering_instances_runs_vllm_with_priority_scheduling() -> None:
    """The router then sends each request's tier as vLLM's `priority` (SageServe v3 §6.5);
    vLLM serves it only with `--scheduling-policy priority`."""
    name = _llama().spec.policy_ref.name
    for order in ("edf", "pf", "dpa"):
        args = _args([_policy(name, {"policy": order})])
        i = args.index("--scheduling-policy")
        assert args[i + 1] == "priority", order


def test_fcfs_a_missing_or_an_invalid_policy_render_vllms_default_scheduler() -> None:
    name = _llama().spec.policy_ref.name
    for policies in (
        [_policy(name, None)],
        [_policy(name, {"policy": "fcfs"})],
        [],
        [_policy(name, {"policy": "lifo"})],  # refused by the API server; FCFS here
        [_policy("other", {"policy": "pf"})],  # another model's policy
    ):
        assert "--scheduling-policy" not in _args(policies), policies


def _engine(kind: str, image: str) -> ModelDeployment:
    raw = _llama().model_dump(by_alias=True, exclude_none=True)
    raw["spec"]["engine"] = {"kind": kind, "image": image, "args": ["--extra"]}
    raw["spec"]["model"]["contextLength"] = 4096
    return ModelDeployment.model_validate(raw)


def _container_and_path(md: ModelDeployment) -> tuple[dict, str]:
    d = render_pod_set(md, md.spec.regions[0], md.spec.variants[0], 1, "llm")
    template = d["spec"]["template"]
    return template["spec"]["containers"][0], template["metadata"]["annotations"][
        "prometheus.io/path"
    ]


def test_an_sglang_deployment_runs_sglangs_server_with_its_metrics_on() -> None:
    container, path = _container_and_path(_engine("sglang", "lmsysorg/sglang:v0.5.4"))
    assert container["name"] == "sglang"
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    args = container["args"]
    assert args[:2] == ["--model-path", "meta-llama/Llama-2-70b-hf"]
    assert args[args.index("--host") + 1] == "0.0.0.0"  # its default listens on loopback
    assert args[args.index("--tp-size") + 1] == "8"
    assert args[args.index("--context-length") + 1] == "4096"
    assert "--enable-metrics" in args  # else SGLang exports no Prometheus metrics
    assert "--scheduling-policy" not in args  # vLLM's flag
    assert args[-1] == "--extra"
    assert path == "/metrics"


def test_a_trtllm_deployment_runs_trtllm_serve_with_prometheus_metrics_on() -> None:
    container, path = _container_and_path(
        _engine("trtllm", "nvcr.io/nvidia/tensorrt-llm/release:1.2.0")
    )
    assert container["command"][:2] == ["/bin/sh", "-c"]
    script = container["command"][2]
    assert "return_perf_metrics: true" in script and "enable_iter_perf_stats: true" in script
    assert 'exec trtllm-serve "$@" --extra_llm_api_options' in script
    args = container["args"]
    assert args[0] == "meta-llama/Llama-2-70b-hf"
    assert args[args.index("--tp_size") + 1] == "8"
    assert args[args.index("--max_seq_len") + 1] == "4096"
    assert path == "/prometheus/metrics"  # trtllm-serve's /metrics is JSON iteration stats


def test_a_vllm_deployment_keeps_the_images_entrypoint_and_metrics_path() -> None:
    container, path = _container_and_path(_llama())
    assert "command" not in container
    assert container["name"] == "vllm"
    assert path == "/metrics"
