"""The gateway's link to a running mesh: its bus client, and its inputs at the mesh's quiet points."""

from __future__ import annotations

from coral.gateway.app import Gateway
from coral.kernel import BusClient, Mesh
from coral.messages.control import ROUTER
from coral.messages.fleet import FleetUpdate
from coral.messages.requests import GATEWAY, RequestResults


class MeshLink:
    """Feeds a ``Gateway`` from the bus (``fleet.update``, the router's ``req.result``) and delivers its
    requests to the router at the mesh's quiet points (``step``), as the input feed delivers arrivals; a
    new request rings the mesh's doorbell, so that a paced driver steps to its arrival time at once."""

    def __init__(self, gateway: Gateway, mesh: Mesh, bus: BusClient) -> None:
        self.gateway = gateway
        self.mesh = mesh
        self.bus = bus

    @classmethod
    async def open(cls, gateway: Gateway, mesh: Mesh) -> MeshLink:
        """Attach ``gateway`` to ``mesh`` under the bus name ``gateway``."""
        bus = await mesh.client(GATEWAY, subscribe=["fleet.update"], inbox_size=1 << 16)
        gateway.linked = True
        gateway.on_pending = mesh.ring
        return cls(gateway, mesh, bus)

    async def run(self) -> None:
        """Take the bus's messages until the client closes (then fail the requests still waiting)."""
        try:
            async for env in self.bus:
                msg = env.msg
                if isinstance(msg, FleetUpdate):
                    self.gateway.on_fleet(msg)
                elif isinstance(msg, RequestResults):
                    self.gateway.on_results(msg)
        finally:
            self.gateway.unlink()

    def step(self, now: float) -> None:
        """Deliver the gateway's new requests to the router and publish its refusals (call only while the
        mesh is quiet)."""
        for msg in self.gateway.take_inputs(now):
            self.mesh.send(ROUTER, msg, source=GATEWAY)
        if self.gateway.auth is not None:
            for refused in self.gateway.auth.reports():
                self.mesh.publish(refused, source=GATEWAY)
