"""Engine keys in a launch plan (pure: no vLLM needed): the HTTP server's environment carries its key, its
command line and every repr do not, and each instance's key is its own."""

from __future__ import annotations

import attrs

from coral.vllm.engine import VllmBackend
from coral.vllm.launch import API_KEY_ENV, LaunchOptions, engine_key, launch_plan
from coral.vllm.tiny import chain_template

OPTS = LaunchOptions(model_path="/models/tiny", served_name="chat", device="cpu", cpu_cores=2, port=8100)


def test_the_key_goes_to_the_http_server_environment_only() -> None:
    key = engine_key(b"k" * 32, "inst-1")
    opts = attrs.evolve(OPTS, api_key=key)
    plan = launch_plan(chain_template("tiny", [2, 2]), ["a", "b"], opts)
    head, follower = plan.servers
    assert head.environment()[API_KEY_ENV] == key and API_KEY_ENV not in head.env
    assert API_KEY_ENV not in follower.environment()  # a headless node serves no HTTP
    assert all(key not in " ".join(s.argv) for s in plan.servers)
    assert key not in repr(plan) and key not in repr(opts)
    assert API_KEY_ENV not in launch_plan(chain_template("tiny", [4]), ["a"], OPTS).head.environment()


def test_engine_keys_are_per_instance_and_per_secret() -> None:
    a, b = b"a" * 32, b"b" * 32
    assert engine_key(a, "i1") == engine_key(a, "i1")
    assert len({engine_key(a, "i1"), engine_key(a, "i2"), engine_key(b, "i1")}) == 3
    assert engine_key(a, "i1").startswith("coral-engine-") and len(engine_key(a, "i1")) == 13 + 64
    one, two = VllmBackend({"m": "/w"}), VllmBackend({"m": "/w"})
    assert len(one.engine_secret) == 32 and one.engine_secret != two.engine_secret  # new for every backend
    assert "engine_secret" not in repr(one)
