"""The evaluations' room of the service: `/api/evals` on the task board, and OSWorld's guest
surface per desktop. It starts after the agent's room (it hooks into the board) and stops
before it."""

from __future__ import annotations

from cubicle.server.board.board import Board
from cubicle.server.evals import api as evals_api
from cubicle.server.evals.osworld import api as osworld_api
from cubicle.server.evals.osworld.api import Surfaces
from cubicle.server.evals.runs import EvalRuns
from cubicle.server.services import Services


class EvalRoom:
    """Mounts `/api/evals` and `/api/desktops/{id}/osworld`; feeds runs to the board."""

    routers = (evals_api.router, osworld_api.router)

    def __init__(self) -> None:
        self.runs: EvalRuns | None = None
        self.surfaces: Surfaces | None = None

    async def start(self, services: Services) -> None:
        settings = services.settings
        suites = evals_api.known_suites(settings.data_dir)
        self.runs = EvalRuns(services.get(Board), settings.data_dir, suites)
        await self.runs.start()
        services.add(self.runs)
        self.surfaces = Surfaces(services)
        self.surfaces.start()
        services.add(self.surfaces)

    async def stop(self) -> None:
        surfaces, self.surfaces = self.surfaces, None
        if surfaces is not None:
            await surfaces.stop()
        runs, self.runs = self.runs, None
        if runs is not None:
            await runs.stop()
