"""The router in the simulated mesh: the run gives it each decode template's KV need, so it pairs handoffs
as the allocation priced them."""

from __future__ import annotations

from actors.compose import CoralMesh
from coral.kernel import Mesh

from ..mesh.helpers import World


async def test_the_mesh_s_router_knows_the_kv_need_of_every_decode_template(world: World) -> None:
    setup = world.setup("mesh-steady")
    want = {t.id: t.kv_min_nic for t in setup.templates if t.mode == "decode"}
    assert want and all(v > 0 for v in want.values())
    seen: dict[str, float] = {}

    async def look(_mesh: Mesh, cm: CoralMesh) -> None:
        assert cm.router is not None
        seen.update(cm.router.kv_need)

    await world.run("mesh-steady", until=1.0, on_start=look)
    assert seen == want
