"""The agent's room of the service: the runs API, and the task board with its workers."""

from __future__ import annotations

from cubicle.protocol.service import CreateDesktop
from cubicle.server.board import api as board_api
from cubicle.server.board import runs_api
from cubicle.server.board.board import Board
from cubicle.server.manager import SandboxManager
from cubicle.server.services import Services


class AgentRoom:
    """Mounts `/api/runs`, `/api/tasks` and `/api/board`; runs the board with the service."""

    routers = (runs_api.router, board_api.router)

    def __init__(self) -> None:
        self.board: Board | None = None
        self.body_limits = {("POST", "/api/tasks/batch"): board_api.BATCH_BYTES}
        """A batch of up to 10,000 tasks may take more than the service's usual body cap."""
        self._manager: SandboxManager | None = None

    async def start(self, services: Services) -> None:
        settings = services.settings
        manager = self._manager = services.manager

        def want_warm(count: int, resolution: tuple[int, int]) -> None:
            manager.want_warm("board", count, CreateDesktop(resolution=resolution))

        self.board = Board(settings.data_dir, services.create_desktop, want_warm=want_warm)
        await self.board.start()
        services.add(self.board)

    async def stop(self) -> None:
        board, self.board = self.board, None
        if board is not None:
            await board.stop()
            if self._manager is not None:
                self._manager.want_warm("board", 0)
