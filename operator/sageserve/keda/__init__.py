"""`actuation: keda`: sageserve plans and decides, KEDA writes the replicas (docs/keda.md).

- `scaler`: what the scaler answers for a pod set (the decided replicas, whether it is
  active), from the decisions the pace loop records (`DecisionBoard`);
- `server`: KEDA's external scaler gRPC service (`externalscaler.proto`) over them;
- `scaledobject`: the ScaledObject the operator owns for each pod set (a pure render);
- `stubs`: regenerates (or checks) the message classes of the .proto.
"""
