"""Templates as vLLM launches (pure: no vLLM needed)."""

from __future__ import annotations

import json

import attrs
import pytest

from coral.store import template_from_json
from coral.templates import SINK, SOURCE, Route, vllm_compatibility
from coral.vllm.launch import KvTransfer, LaunchOptions, VllmLaunchError, cpu_threads_bind, launch_plan
from coral.vllm.tiny import chain_template

OPTS = LaunchOptions(model_path="/models/tiny", served_name="chat", device="cpu", cpu_cores=2, port=8100)


def _arg(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_single_stage_is_one_plain_server() -> None:
    plan = launch_plan(chain_template("tiny", [4]), ["h"], OPTS)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.nnodes) == (1, 1, 1)
    s = plan.head
    assert s.serves_http and s.stages == (0,)
    assert _arg(s.argv, "--pipeline-parallel-size") == "1"
    assert _arg(s.argv, "--served-model-name") == "chat"
    assert _arg(s.argv, "--port") == "8100"
    assert "--distributed-executor-backend" not in s.argv
    assert "VLLM_PP_LAYER_PARTITION" not in s.env
    assert s.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert plan.url == "http://127.0.0.1:8100"


def test_uneven_two_stages_on_one_host_are_pp2_with_the_layer_partition() -> None:
    plan = launch_plan(chain_template("tiny", [1, 3]), ["h", "h"], OPTS)
    assert (plan.pipeline_parallel, plan.nnodes, plan.layer_partition) == (2, 1, (1, 3))
    (s,) = plan.servers
    assert s.stages == (0, 1)
    assert _arg(s.argv, "--pipeline-parallel-size") == "2"
    assert _arg(s.argv, "--distributed-executor-backend") == "mp"
    assert s.env["VLLM_PP_LAYER_PARTITION"] == "1,3"
    assert s.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"


def test_the_pipeline_follows_the_route_not_the_stage_numbers() -> None:
    t = chain_template("tiny", [3, 1])
    s0, s1 = t.stages
    # stage 1 holds layers 0..2 and runs first; stage 0 holds layer 3
    t = attrs.evolve(
        t,
        stages=(attrs.evolve(s0, start=3, end=4), attrs.evolve(s1, start=0, end=3)),
        routes=(Route(SOURCE, 1, 1.0), Route(1, 0, 1.0), Route(0, SINK, 1.0)),
    )
    plan = launch_plan(t, ["a", "a"], OPTS)
    assert plan.stage_order == (1, 0)
    assert plan.layer_partition == (3, 1)


def test_tp_comes_from_the_stages_and_must_be_one_degree() -> None:
    t = chain_template("tiny", [2, 2], tp=4)
    plan = launch_plan(t, ["h", "h"], attrs.evolve(OPTS, device="gpu"))
    assert _arg(plan.head.argv, "--tensor-parallel-size") == "4"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in plan.head.env
    mixed = attrs.evolve(t, stages=(t.stages[0], attrs.evolve(t.stages[1], tp=2)))
    ok, reason = vllm_compatibility(mixed.stages, mixed.routes)
    assert not ok and "TP" in reason
    with pytest.raises(VllmLaunchError, match="different TP degrees"):
        launch_plan(mixed, ["h", "h"], OPTS)


def test_branching_routes_are_refused() -> None:
    t = chain_template("tiny", [4, 4])
    t = attrs.evolve(
        t,
        num_layers=4,
        stages=(attrs.evolve(t.stages[0], start=0, end=4), attrs.evolve(t.stages[1], start=0, end=4)),
        routes=(Route(SOURCE, 0, 0.5), Route(SOURCE, 1, 0.5), Route(0, SINK, 0.5), Route(1, SINK, 0.5)),
    )
    ok, reason = vllm_compatibility(t.stages, t.routes)
    assert not ok and "branch" in reason
    with pytest.raises(VllmLaunchError, match="branch"):
        launch_plan(t, ["h", "h"], OPTS)


def test_layers_must_cover_the_model_in_order() -> None:
    t = chain_template("tiny", [2, 2])
    gap = attrs.evolve(t, stages=(t.stages[0], attrs.evolve(t.stages[1], start=3, end=5)), num_layers=5)
    with pytest.raises(VllmLaunchError, match="start at layer 2"):
        launch_plan(gap, ["h", "h"], OPTS)
    short = attrs.evolve(t, num_layers=6)
    with pytest.raises(VllmLaunchError, match="up to 4, the model has 6"):
        launch_plan(short, ["h", "h"], OPTS)


def test_multi_node_uses_the_mp_multi_node_launch() -> None:
    t = chain_template("tiny", [1, 1, 1, 1], tp=8)
    plan = launch_plan(t, ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"], attrs.evolve(OPTS, device="gpu"))
    assert plan.nnodes == 2
    head, other = plan.servers
    assert head.stages == (0, 1) and other.stages == (2, 3)
    for rank, s in enumerate(plan.servers):
        assert _arg(s.argv, "--nnodes") == "2"
        assert _arg(s.argv, "--node-rank") == str(rank)
        assert _arg(s.argv, "--master-addr") == "10.0.0.1"
        assert _arg(s.argv, "--pipeline-parallel-size") == "4"
        assert _arg(s.argv, "--tensor-parallel-size") == "8"
        assert s.env["VLLM_PP_LAYER_PARTITION"] == "1,1,1,1"
    assert head.serves_http and "--port" in head.argv and "--headless" not in head.argv
    assert not other.serves_http and "--headless" in other.argv and "--port" not in other.argv
    assert plan.for_stage(2) is other and plan.for_stage(1) is None


def test_multi_node_needs_equal_consecutive_shares() -> None:
    t = chain_template("tiny", [1, 1, 2])
    with pytest.raises(VllmLaunchError, match="different numbers of stages"):
        launch_plan(t, ["a", "a", "b"], OPTS)
    with pytest.raises(VllmLaunchError, match="not consecutive"):
        launch_plan(chain_template("tiny", [1, 1, 1, 1]), ["a", "b", "a", "b"], OPTS)
    with pytest.raises(VllmLaunchError, match="3 stages but 2 hosts"):
        launch_plan(t, ["a", "b"], OPTS)


def test_disaggregated_pairs_get_kv_transfer_configs() -> None:
    kv = KvTransfer("ExampleConnector", "/shared/kv")
    pre = launch_plan(chain_template("tiny", [4], mode="prefill"), ["h"], attrs.evolve(OPTS, kv_transfer=kv))
    dec = launch_plan(chain_template("tiny", [4], mode="decode"), ["h"], attrs.evolve(OPTS, kv_transfer=kv))
    cp = json.loads(_arg(pre.head.argv, "--kv-transfer-config"))
    cd = json.loads(_arg(dec.head.argv, "--kv-transfer-config"))
    assert cp["kv_connector"] == cd["kv_connector"] == "ExampleConnector"
    assert (cp["kv_role"], cd["kv_role"]) == ("kv_producer", "kv_consumer")
    assert cp["kv_connector_extra_config"] == {"shared_storage_path": "/shared/kv"}
    nixl = KvTransfer("NixlConnector", side_channel_port=5601)
    g = launch_plan(
        chain_template("tiny", [4], mode="decode"), ["h"], attrs.evolve(OPTS, device="gpu", kv_transfer=nixl)
    )
    assert json.loads(_arg(g.head.argv, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
    }
    assert g.head.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"


def test_kv_transfer_mismatches_are_refused() -> None:
    with pytest.raises(VllmLaunchError, match="needs a KV-transfer connector"):
        launch_plan(chain_template("tiny", [4], mode="prefill"), ["h"], OPTS)
    kv = KvTransfer("ExampleConnector", "/kv")
    with pytest.raises(VllmLaunchError, match="aggregated instance takes no KV"):
        launch_plan(chain_template("tiny", [4]), ["h"], attrs.evolve(OPTS, kv_transfer=kv))
    with pytest.raises(VllmLaunchError, match="connector must be one of"):
        KvTransfer("P2pNcclConnector").check()
    with pytest.raises(VllmLaunchError, match="shared directory"):
        KvTransfer("ExampleConnector", "").check()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"device": "tpu"}, "device: must be one of cpu, gpu"),
        ({"port": 0}, "port: must be in 1..65535"),
        ({"model_path": ""}, "model: a model directory"),
        ({"max_model_len": 0}, "max_model_len: must be positive"),
        ({"cpu_cores": 0}, "cpu_cores: must be at least 1"),
    ],
)
def test_bad_options_are_named(change: dict[str, object], match: str) -> None:
    with pytest.raises(VllmLaunchError, match=match):
        launch_plan(chain_template("tiny", [4]), ["h"], attrs.evolve(OPTS, **change))


def test_cpu_binding_splits_the_cores() -> None:
    assert cpu_threads_bind(1, 2) == "0-1"
    assert cpu_threads_bind(2, 2) == "0|1"
    assert cpu_threads_bind(2, 16) == "0-7|8-15"
    with pytest.raises(VllmLaunchError, match="need at least 3 cores"):
        cpu_threads_bind(3, 2)
    with pytest.raises(VllmLaunchError, match="4 CPU workers need at least 4 cores"):
        launch_plan(chain_template("tiny", [1, 1, 1, 1]), ["h"] * 4, OPTS)


def test_old_stores_without_the_vllm_fields_derive_them() -> None:
    t = chain_template("tiny", [1, 3])
    d = t.to_json()
    del d["vllm_ok"], d["vllm_reason"]
    back = template_from_json(d)
    assert back.vllm_ok and back.vllm_reason == ""
    mixed = attrs.evolve(t, stages=(t.stages[0], attrs.evolve(t.stages[1], tp=2))).to_json()
    del mixed["vllm_ok"], mixed["vllm_reason"]
    got = template_from_json(mixed)
    assert not got.vllm_ok and "TP" in got.vllm_reason
    stored = template_from_json(attrs.evolve(t, vllm_ok=False, vllm_reason="kept").to_json())
    assert (stored.vllm_ok, stored.vllm_reason) == (False, "kept")
