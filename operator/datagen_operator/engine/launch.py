"""The exact `python3 -m sglang.launch_server` argv for a run: a pure function of the spec."""

from __future__ import annotations

from datagen_operator.api.errors import SpecError
from datagen_operator.api.extra_args import extra_arg_errors
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import DataGenRunSpec

LAUNCH_MODULE = "sglang.launch_server"

DETERMINISTIC_FLAG = "--enable-deterministic-inference"
"""SGLang uses `sampling_seed` only with this flag (and then seeds unseeded requests with 42)."""

# A server over several pods is a LeaderWorkerSet group; LWS's pod webhook gives every container of the
# group these variables, and Kubernetes expands `$(NAME)` in a container's args from its environment, so
# every pod of the group runs the same command and learns its rank and its leader from LWS.
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
"""DNS name of the group's leader pod (through the LeaderWorkerSet's headless Service)."""
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
"""0 on the leader, 1..size-1 on the workers: SGLang's --node-rank."""
DIST_INIT_PORT = 20000
"""Where rank 0 (the leader) listens for the other ranks' torch.distributed rendezvous."""


def server_argv(
    spec: DataGenRunSpec,
    *,
    host: str = "0.0.0.0",
    port: int | None = None,
    python: str = "python3",
    model_path: str | None = None,
    resolved: ResolvedModel | None = None,
) -> list[str]:
    """The launch command. `model_path` overrides spec.model.path (the local runner resolves it); `resolved`:
    the model as the caller resolved it for this pass (else resolved here). With server.nodes > 1 it is every
    pod's command, `$(LWS_...)` left for Kubernetes to expand per pod."""
    resolved = resolved or resolve_model(spec)
    errors = extra_arg_errors(spec.server.extra_args)
    if errors:
        raise SpecError(errors)
    server = spec.server
    argv = [python, "-m", LAUNCH_MODULE, "--model-path", model_path or spec.model.path]
    if spec.model.tokenizer_path:
        # The server loads the tokenizer the workers render with: its stop ids and chat template are the run's.
        argv += ["--tokenizer-path", spec.model.tokenizer_path]
    argv += ["--tp-size", str(server.tp_size)]
    if server.dp_size > 1:
        argv += ["--dp-size", str(server.dp_size)]
    if server.attn_dp_size > 1:
        argv += ["--attn-dp-size", str(server.attn_dp_size)]
    if server.nodes > 1:
        argv += ["--nnodes", str(server.nodes), "--node-rank", f"$({WORKER_INDEX_ENV})"]
        argv += ["--dist-init-addr", f"$({LEADER_ADDRESS_ENV}):{DIST_INIT_PORT}"]
    if server.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(server.mem_fraction_static)]
    if resolved.trust_remote_code:
        argv.append("--trust-remote-code")
    if resolved.reasoning_parser:
        argv += ["--reasoning-parser", resolved.reasoning_parser]
    if resolved.tool_call_parser:
        argv += ["--tool-call-parser", resolved.tool_call_parser]
    if spec.model.served_model_name:
        argv += ["--served-model-name", spec.model.served_model_name]
    argv += ["--host", host, "--port", str(port or server.port)]
    argv.append("--enable-metrics")
    if spec.generation.stream:
        argv.append("--incremental-streaming-output")
    argv += ["--log-level", server.log_level]
    if spec.generation.sampling.sampling_seed is not None and DETERMINISTIC_FLAG not in server.extra_args:
        argv.append(DETERMINISTIC_FLAG)  # without it SGLang ignores the seed: the spec's seed would be a lie
    argv += server.extra_args
    return argv
